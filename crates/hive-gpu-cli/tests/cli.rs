//! The `hive-gpu` binary end to end: info, bench on the embedded data and on files, search,
//! and the errors a user sees.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary cargo built, or `hive-gpu` on PATH where the tests run from a bundle.
fn binary() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_hive-gpu"));
    if built.exists() { built } else { PathBuf::from("hive-gpu") }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary());
    command.args(args).env_remove("HIVE_GPU_BACKEND");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the hive-gpu binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn data_dir() -> PathBuf {
    let mut dir = std::env::current_dir().expect("cwd");
    loop {
        if dir.join("data/siftsmall").is_dir() {
            return dir.join("data");
        }
        assert!(dir.pop(), "no data/siftsmall above the working directory");
    }
}

/// The numeric value of `"key":` in a one-line JSON object.
fn field(json: &str, key: &str) -> f64 {
    let start =
        json.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key} in {json}")) + key.len() + 3;
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].parse().unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

#[test]
fn info_lists_every_backend_with_a_reason() {
    let out = run(&["info"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for backend in ["cuda", "rocm", "vulkan", "metal", "cpu"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(backend))
            .unwrap_or_else(|| panic!("no {backend} line in\n{text}"));
        assert!(line.contains("yes") || line.contains("no"), "{line}");
    }
    assert!(text.contains("memory total"), "{text}");
}

#[test]
fn bench_on_embedded_sift_reports_exact_recall() {
    let out = run(&["bench", "--backend", "cpu", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json = stdout(&out);
    for key in
        ["backend", "device", "n", "dim", "nq", "k", "metric", "recall", "qps", "p50_ms", "p99_ms", "build_s"]
    {
        assert!(json.contains(&format!("\"{key}\":")), "{key} missing from {json}");
    }
    assert_eq!(field(&json, "n"), 10_000.0);
    assert_eq!(field(&json, "dim"), 128.0);
    assert_eq!(field(&json, "nq"), 100.0);
    assert_eq!(field(&json, "recall"), 1.0, "{json}");
    assert!(field(&json, "qps") > 0.0);
}

#[test]
fn bench_human_report_one_by_one() {
    let out = run(&["bench", "--batch", "1", "-k", "5"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("recall@5") && text.contains("1.0000"), "{text}");
    assert!(text.contains("1 queries per call"), "{text}");
}

#[test]
fn bench_on_a_data_folder_and_other_metrics() {
    let dir = data_dir().join("fmnistsmall");
    let out = run(&["bench", "--data", dir.to_str().expect("utf-8 path"), "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(field(&stdout(&out), "recall"), 1.0);
    // No ground truth for cosine: recall is measured against the f64 reference instead.
    let out = run(&["bench", "--metric", "cosine", "--precision", "f16", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json = stdout(&out);
    assert_eq!(field(&json, "recall"), 1.0, "{json}");
    assert!(json.contains("f64 brute force"), "{json}");
}

#[test]
fn search_prints_ids_and_scores() {
    let dir = data_dir().join("siftsmall");
    let base = dir.join("siftsmall_base.fvecs");
    let query = dir.join("siftsmall_query.fvecs");
    let out = run(
        &[
            "search",
            "--base",
            base.to_str().expect("path"),
            "--query",
            query.to_str().expect("path"),
            "-k",
            "3",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 100);
    // Query 0's nearest neighbours in the published ground truth are 2176, 3752, 882.
    assert!(
        text.lines().next().is_some_and(|l| l.starts_with("query 0: 2176:") && l.contains(" 3752:")),
        "{text}"
    );
}

#[test]
fn unavailable_backend_and_bad_arguments_are_clear_errors() {
    // Metal is never available on the machines these tests run on (it will come through wgpu).
    let out = run(&["bench"], &[("HIVE_GPU_BACKEND", "metal")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Metal backend unavailable"), "{}", stderr(&out));
    let out = run(&["bench"], &[("HIVE_GPU_BACKEND", "bogus")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("HIVE_GPU_BACKEND"), "{}", stderr(&out));
    let out = run(&["bench", "--base", "/nonexistent/base.fvecs", "--query", "/nonexistent/q.fvecs"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("/nonexistent/base.fvecs"), "{}", stderr(&out));
    let out = run(&["bench", "-k", "0"], &[]);
    assert!(!out.status.success());
}

/// What `hive-gpu info` and `hive-gpu bench --backend rocm` say about ROCm here. CI installs
/// Debian's HIP runtime without an AMD GPU and sets `HIVE_GPU_EXPECT_ROCM=no-device`, so the
/// "runtime found, no device" path is checked end to end; elsewhere the reason must still be
/// one of the precise ones.
#[test]
fn rocm_unavailable_says_precisely_why() {
    let info = stdout(&run(&["info"], &[]));
    let line =
        info.lines().find(|l| l.starts_with("rocm")).unwrap_or_else(|| panic!("no rocm line in\n{info}"));
    let no_device = line.contains("ROCm runtime found") && line.contains("no AMD GPU");
    let no_runtime = line.contains("no ROCm runtime: none of libamdhip64.so.7");
    match std::env::var("HIVE_GPU_EXPECT_ROCM").as_deref() {
        Ok("no-device") => assert!(no_device, "{line}"),
        Ok("no-runtime") => assert!(no_runtime, "{line}"),
        Ok(other) => panic!("HIVE_GPU_EXPECT_ROCM={other:?}: expected no-device or no-runtime"),
        Err(_) => assert!(
            line.contains(" yes ")
                || no_device
                || no_runtime
                || line.contains("ROCm runtime found")
                || line.contains("lacks"),
            "{line}"
        ),
    }
    if no_device || no_runtime {
        let out = run(&["bench", "--backend", "rocm"], &[]);
        assert!(!out.status.success(), "bench on an unavailable backend must fail");
        let err = stderr(&out);
        assert!(err.contains("ROCm backend unavailable"), "{err}");
        assert!(err.contains(if no_device { "no AMD GPU" } else { "no ROCm runtime" }), "{err}");
        let out = run(&["bench"], &[("HIVE_GPU_BACKEND", "rocm")]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("ROCm backend unavailable"), "{}", stderr(&out));
    }
}

#[test]
fn a_closed_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = data_dir().join("siftsmall");
    let base = dir.join("siftsmall_base.fvecs");
    let query = dir.join("siftsmall_query.fvecs");
    // About 1.5 MB of output: far more than a pipe holds, so the writer meets the closed end.
    let mut child = Command::new(binary())
        .args([
            "search",
            "--base",
            base.to_str().expect("path"),
            "--query",
            query.to_str().expect("path"),
            "-k",
            "1000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("one line");
    assert!(first.starts_with("query 0: 2176:"), "{first}");
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}
