//! Every WGSL module of the wgpu backend, translated by naga to MSL and to HLSL, as wgpu
//! translates them on Metal (macOS, iOS) and DX12 (Windows): CI has neither, so this is where a
//! kernel that those shader compilers' front ends would refuse fails. Each module is validated
//! with exactly the capabilities naga's back end supports (wgpu asks no more of a device), then
//! written. Translated, never run: no kernel here has met Apple or Windows hardware.

use naga::back::{hlsl, msl};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

use super::Modules;

/// The Metal Shading Language version asked for: 2.4 (macOS 12, iOS 15) has the SIMD-group
/// functions the subgroup kernels use and the SIMD-group matrices of the tensor-core filter.
const MSL_VERSION: (u8, u8) = (2, 4);

/// The HLSL shader model asked for: 6.2 has 16-bit types, 6.0 the wave operations.
const SHADER_MODEL: hlsl::ShaderModel = hlsl::ShaderModel::V6_2;

fn validated(
    name: &str,
    source: &str,
    capabilities: Capabilities,
) -> Result<(naga::Module, ModuleInfo), String> {
    let module =
        naga::front::wgsl::parse_str(source).map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    let info = Validator::new(ValidationFlags::all(), capabilities)
        .validate(&module)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    Ok((module, info))
}

/// `source` as Metal Shading Language, or why not.
fn to_msl(name: &str, source: &str) -> Result<String, String> {
    let (module, info) = validated(name, source, msl::supported_capabilities())?;
    let options = msl::Options { lang_version: MSL_VERSION, ..Default::default() };
    msl::write_string(&module, &info, &options, &msl::PipelineOptions::default())
        .map(|(text, _)| text)
        .map_err(|e| format!("{name}: MSL: {e}"))
}

/// `source` as HLSL, or why not.
fn to_hlsl(name: &str, source: &str) -> Result<String, String> {
    let (module, info) = validated(name, source, hlsl::supported_capabilities())?;
    let options = hlsl::Options { shader_model: SHADER_MODEL, ..Default::default() };
    let mut text = String::new();
    hlsl::Writer::new(&mut text, &options, &hlsl::PipelineOptions::default())
        .write(&module, &info, None)
        .map_err(|e| format!("{name}: HLSL: {e}"))?;
    Ok(text)
}

/// Every compute entry point of `source` appears in `text` (a translation that dropped one
/// would leave wgpu without the pipeline).
fn assert_entry_points(name: &str, source: &str, text: &str, language: &str) {
    let module = naga::front::wgsl::parse_str(source).expect("parsed before");
    assert!(!module.entry_points.is_empty(), "{name}: no entry point");
    for entry in &module.entry_points {
        assert!(text.contains(&entry.name), "{name}: {language} lacks entry point {}", entry.name);
    }
}

#[test]
fn every_search_and_selection_kernel_translates_to_msl_and_hlsl() {
    for (name, source) in Modules::new().all() {
        for (language, text) in [("MSL", to_msl(name, &source)), ("HLSL", to_hlsl(name, &source))] {
            let text = text.unwrap_or_else(|e| panic!("{e}"));
            assert_entry_points(name, &source, &text, language);
        }
    }
}

#[test]
fn the_tensor_core_filter_translates_to_msl_at_every_dimension_and_not_to_hlsl() {
    for dim in (16..=super::filter::MAX_DIM).step_by(16) {
        for f16_rows in [false, true] {
            let name = format!("filter dim {dim} f16 rows {f16_rows}");
            let source = super::filter::source(dim, f16_rows);
            let text = to_msl(&name, &source).unwrap_or_else(|e| panic!("{e}"));
            assert_entry_points(&name, &source, &text, "MSL");
            // naga's HLSL back end has no cooperative matrices (nor subgroup barriers): on
            // DX12 the filter is not offered, and batches take the tiled path (README).
            let refused = to_hlsl(&name, &source).expect_err("HLSL has no cooperative matrices");
            assert!(refused.contains("apabilit") || refused.contains("COOPERATIVE"), "{name}: {refused}");
        }
    }
}
