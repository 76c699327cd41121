//! Stored element types, once for every backend and the file format: how an f32 value becomes
//! a stored element of each [`StoragePrecision`] (its little-endian bytes), whether it can, and
//! how stored bytes widen back to f32.
//!
//! Every stored element widens to an f32 exactly: f16 and bf16 are f32 with fewer bits, and
//! integers of at most 8 bits are far inside f32's 24-bit significand. So a backend that
//! widens its rows before it multiplies sees the stored values themselves, and the error bounds
//! of f32 arithmetic (`exact/error.rs`) hold for it unchanged; the f64 re-rank of the widened
//! values is exact over what is stored.
//!
//! The float types round the input (to nearest, ties to even); the integer types store
//! integers only and refuse anything else, rather than round a user's values silently: an
//! integer collection is for data that is integral (SIFT's bytes, int8 embeddings), and a
//! quantized copy of float data is an index's job (`sq8`).

use crate::types::StoragePrecision;
use half::{bf16, f16};

/// Bytes of one stored element of `precision`.
pub(crate) fn element_bytes(precision: StoragePrecision) -> usize {
    match precision {
        StoragePrecision::F32 => 4,
        StoragePrecision::F16 | StoragePrecision::Bf16 => 2,
        StoragePrecision::I8 | StoragePrecision::U8 => 1,
    }
}

/// Why `x` cannot be stored as `precision`, if it cannot (`x` is finite: the caller checked).
pub(crate) fn unrepresentable(x: f32, precision: StoragePrecision) -> Option<&'static str> {
    match precision {
        StoragePrecision::F32 => None,
        StoragePrecision::F16 => {
            f16::from_f32(x).is_infinite().then_some("is outside the f16 storage range (|x| <= 65504)")
        }
        StoragePrecision::Bf16 => bf16::from_f32(x)
            .is_infinite()
            .then_some("is outside the bf16 storage range (|x| <= 3.3895e38)"),
        StoragePrecision::I8 => (x.fract() != 0.0 || !(-128.0..=127.0).contains(&x))
            .then_some("is not an integer in -128..=127 (i8 storage holds integers exactly; quantize first, or use an sq8 index)"),
        StoragePrecision::U8 => (x.fract() != 0.0 || !(0.0..=255.0).contains(&x))
            .then_some("is not an integer in 0..=255 (u8 storage holds integers exactly; quantize first, or use an sq8 index)"),
    }
}

/// Refuses `values` (rows about to be stored, row-major) when one cannot be stored as
/// `precision`: what every row store's `append` checks, so that a store reached directly
/// (`RowStore` is public) never rounds a value an integer type cannot hold.
pub(crate) fn check_storable(values: &[f32], precision: StoragePrecision) -> crate::error::Result<()> {
    if precision == StoragePrecision::F32 {
        return Ok(());
    }
    match values.iter().enumerate().find_map(|(i, &x)| unrepresentable(x, precision).map(|why| (i, x, why))) {
        Some((i, x, why)) => {
            Err(crate::error::HiveGpuError::InvalidArgument(format!("value {i} of the rows, {x}, {why}")))
        }
        None => Ok(()),
    }
}

/// `x` as the value `precision` stores (rounded for the float types; an integer type's values
/// are checked integers already, see [`unrepresentable`]).
pub(crate) fn stored_value(x: f32, precision: StoragePrecision) -> f32 {
    match precision {
        StoragePrecision::F32 => x,
        // An integer has no negative zero: -0.0 is stored as 0.
        StoragePrecision::I8 | StoragePrecision::U8 => x + 0.0,
        StoragePrecision::F16 => f16::from_f32(x).to_f32(),
        StoragePrecision::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

/// `values` as stored elements of `precision` into `out`, whose length is
/// `values.len() * element_bytes(precision)`, little-endian (the file's and every device's
/// order). Integer types take values [`unrepresentable`] passed; others saturate.
pub(crate) fn narrow_into(values: &[f32], precision: StoragePrecision, out: &mut [u8]) {
    let size = element_bytes(precision);
    debug_assert_eq!(out.len(), values.len() * size);
    let pairs = out.chunks_exact_mut(size).zip(values);
    match precision {
        StoragePrecision::F32 => pairs.for_each(|(o, &v)| o.copy_from_slice(&v.to_le_bytes())),
        StoragePrecision::F16 => pairs.for_each(|(o, &v)| o.copy_from_slice(&f16::from_f32(v).to_le_bytes())),
        StoragePrecision::Bf16 => {
            pairs.for_each(|(o, &v)| o.copy_from_slice(&bf16::from_f32(v).to_le_bytes()))
        }
        StoragePrecision::I8 => pairs.for_each(|(o, &v)| o[0] = (v as i8) as u8),
        StoragePrecision::U8 => pairs.for_each(|(o, &v)| o[0] = v as u8),
    }
}

/// `values` as stored elements of `precision` (see [`narrow_into`]): what a save writes. On a
/// little-endian machine f32 values are their own bytes (no copy).
pub(crate) fn narrow(values: &[f32], precision: StoragePrecision) -> std::borrow::Cow<'_, [u8]> {
    if precision == StoragePrecision::F32 && cfg!(target_endian = "little") {
        return std::borrow::Cow::Borrowed(bytemuck::cast_slice(values));
    }
    let mut out = vec![0u8; values.len() * element_bytes(precision)];
    narrow_into(values, precision, &mut out);
    std::borrow::Cow::Owned(out)
}

/// Stored elements of `precision` (little-endian) as f32 into `out`, replacing what it held:
/// exact for every type.
pub(crate) fn widen(bytes: &[u8], precision: StoragePrecision, out: &mut Vec<f32>) {
    out.clear();
    match precision {
        StoragePrecision::F32 => {
            out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        }
        StoragePrecision::F16 => {
            out.extend(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()));
        }
        StoragePrecision::Bf16 => {
            out.extend(bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()));
        }
        StoragePrecision::I8 => out.extend(bytes.iter().map(|&b| f32::from(b as i8))),
        StoragePrecision::U8 => out.extend(bytes.iter().map(|&b| f32::from(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [StoragePrecision; 5] = [
        StoragePrecision::F32,
        StoragePrecision::F16,
        StoragePrecision::Bf16,
        StoragePrecision::I8,
        StoragePrecision::U8,
    ];

    #[test]
    fn every_storable_value_survives_narrow_and_widen_as_its_stored_value() {
        let values =
            [0.0f32, -0.0, 1.0, -1.0, 127.0, -128.0, 255.0, 3.0, 0.1, -2.5e-3, 1e-41, 60000.0, 3.0e38];
        for precision in ALL {
            let kept: Vec<f32> =
                values.iter().copied().filter(|&x| unrepresentable(x, precision).is_none()).collect();
            let mut back = Vec::new();
            widen(&narrow(&kept, precision), precision, &mut back);
            let expected: Vec<f32> = kept.iter().map(|&x| stored_value(x, precision)).collect();
            assert_eq!(
                back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                expected.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{precision}"
            );
        }
    }

    #[test]
    fn integer_types_refuse_fractions_and_values_one_past_their_range() {
        for (x, i8_ok, u8_ok) in [
            (0.5f32, false, false),
            (-128.0, true, false),
            (-129.0, false, false),
            (127.0, true, true),
            (128.0, false, true),
            (255.0, false, true),
            (256.0, false, false),
            (-1.0, true, false),
            (1e-45, false, false),
        ] {
            assert_eq!(unrepresentable(x, StoragePrecision::I8).is_none(), i8_ok, "i8 {x}");
            assert_eq!(unrepresentable(x, StoragePrecision::U8).is_none(), u8_ok, "u8 {x}");
        }
        // bf16 keeps f32's range but not its largest values; f16 stops at 65504.
        assert!(unrepresentable(f32::MAX, StoragePrecision::Bf16).is_some());
        assert!(unrepresentable(3.0e38, StoragePrecision::Bf16).is_none());
        assert!(unrepresentable(65520.0, StoragePrecision::F16).is_some());
    }

    #[test]
    fn bf16_rounds_to_nearest_even_not_by_truncation() {
        // 1 + 2^-8 + 2^-16 is above the midpoint between 1 and 1 + 2^-7: truncating the low
        // bits would give 1.
        let x = 1.0 + 2f32.powi(-8) + 2f32.powi(-16);
        assert_eq!(stored_value(x, StoragePrecision::Bf16), 1.0 + 2f32.powi(-7));
        // The exact midpoint goes to the even neighbour, 1.
        assert_eq!(stored_value(1.0 + 2f32.powi(-8), StoragePrecision::Bf16), 1.0);
    }
}
