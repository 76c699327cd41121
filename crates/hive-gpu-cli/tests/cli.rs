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
fn bench_measures_each_search_setting_of_one_ivf_index_and_finds_the_cheapest_reaching_a_target() {
    let args = [
        "bench",
        "--backend",
        "cpu",
        "--index",
        "ivf-flat:nlist=32",
        "--search",
        "nprobe=1",
        "--search",
        "nprobe=32",
        "--target-recall",
        "0.999",
        "--json",
    ];
    let out = run(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "one object per setting and the target's: {text}");
    for line in &lines[..2] {
        assert!(line.contains("\"index\":\"ivf-flat:nlist=32\""), "{line}");
        assert!(field(line, "index_build_s") > 0.0 && field(line, "bytes_per_vector") >= 512.0, "{line}");
    }
    assert!(
        lines[0].contains("\"search_params\":\"nprobe=1\"") && field(lines[0], "recall") < 1.0,
        "{}",
        lines[0]
    );
    // Every list probed: the exact search's recall.
    assert_eq!(field(lines[1], "recall"), 1.0, "{}", lines[1]);
    assert!(
        lines[2].contains("\"target_recall\":0.999") && lines[2].contains("\"search_params\":\"nprobe=32\""),
        "{}",
        lines[2]
    );

    // IVF-PQ: its codes nominate, the exact re-rank decides; re-ranking every row of every
    // list is the exact search.
    let pq = run(
        &[
            "bench",
            "--backend",
            "cpu",
            "--index",
            "ivf-pq:nlist=16,m=8,bits=8",
            "--search",
            "nprobe=16,refine=1000",
            "--json",
        ],
        &[],
    );
    assert!(pq.status.success(), "{}", stderr(&pq));
    let line = stdout(&pq);
    assert!(line.contains("\"index\":\"ivf-pq:nlist=16,m=8,bits=8\""), "{line}");
    assert_eq!(field(&line, "recall"), 1.0, "{line}");

    let human = run(&["bench", "--backend", "cpu", "--index", "ivf-flat:nlist=16"], &[]);
    assert!(human.status.success(), "{}", stderr(&human));
    assert!(stdout(&human).contains("ivf-flat:nlist=16 (nprobe=20 (default))"), "{}", stdout(&human));
    for (bad, needle) in [
        (["--index", "ivf-flat:nlist=0"], "nlist must be a whole number"),
        (["--index", "hnsw:m=8"], "unknown index kind"),
        (["--index", "ivf-pq:m=8"], "nlist=N is required"),
        (["--index", "pq:m=8,bits=5"], "bits must be 4 or 8"),
        (["--search", "nprobe=x"], "nprobe must be a whole number"),
        (["--search", "probes=3"], "unknown parameter"),
    ] {
        let mut all = vec!["bench", "--backend", "cpu"];
        all.extend(bad);
        let out = run(&all, &[]);
        assert!(!out.status.success(), "{bad:?} must fail");
        assert!(stderr(&out).contains(needle), "{bad:?}: {}", stderr(&out));
    }
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
fn l1_and_linf_bench_against_their_own_brute_force_not_the_l2_ground_truth() {
    // siftsmall's ground truth is for l2: l1 and l-infinity must not be scored against it.
    let dir = data_dir().join("siftsmall");
    for metric in ["l1", "linf"] {
        for batch in ["1", "100"] {
            let args = ["bench", "--data", dir.to_str().expect("path"), "--metric", metric, "--batch", batch];
            let out = run(&[&args[..], &["--json"]].concat(), &[]);
            assert!(out.status.success(), "{metric}: {}", stderr(&out));
            let json = stdout(&out);
            assert_eq!(field(&json, "recall"), 1.0, "{metric} batch {batch}: {json}");
            assert!(json.contains("f64 brute force"), "{metric}: {json}");
        }
        // The approximate indexes are built on inner products: a clear refusal.
        let out =
            run(&["bench", "--backend", "cpu", "--metric", metric, "--index", "ivf-flat:nlist=16"], &[]);
        assert!(!out.status.success(), "{metric}: an IVF index must be refused");
        assert!(stderr(&out).contains(&format!("this collection's metric is {metric}")), "{}", stderr(&out));
    }
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

/// A scratch directory of one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hive-gpu-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    fn ivecs(&self, name: &str, rows: &[Vec<i32>]) -> String {
        let path = self.0.join(name);
        let dim = rows.first().map_or(0, Vec::len);
        let m = hive_gpu::io::IdMatrix { rows: rows.len(), dim, data: rows.concat() };
        hive_gpu::io::write_ivecs(&path, &m).expect("write ivecs");
        path.to_str().expect("utf-8").to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sift(file: &str) -> String {
    data_dir().join("siftsmall").join(file).to_str().expect("utf-8").to_string()
}

#[test]
fn search_json_has_ids_and_scores_as_arrays() {
    let (base, query) = (sift("siftsmall_base.fvecs"), sift("siftsmall_query.fvecs"));
    let out =
        run(&["search", "--base", &base, "--query", &query, "-k", "3", "--json", "--backend", "cpu"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = stdout(&out).lines().next().expect("a line").to_string();
    assert!(first.starts_with(r#"{"query":0,"ids":["2176","3752","882"],"scores":["#), "{first}");
    assert!(first.ends_with("]}"), "{first}");
}

#[test]
fn a_dimension_mismatch_names_both_files() {
    let base = sift("siftsmall_base.fvecs");
    let query = data_dir().join("fmnistsmall/fmnistsmall_query.fvecs").to_str().expect("utf-8").to_string();
    for command in ["search", "bench"] {
        let out = run(&[command, "--base", &base, "--query", &query, "--backend", "cpu"], &[]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains("query file")
                && err.contains("fmnistsmall_query.fvecs has 784")
                && err.contains("siftsmall_base.fvecs has 128"),
            "{command}: {err}"
        );
    }
}

#[test]
fn zero_and_out_of_range_counts_are_refused_not_adjusted() {
    for (args, says) in [
        (&["--batch", "0"][..], "--batch must be at least 1"),
        (&["--nq", "0"][..], "--nq must be at least 1"),
        (&["--nq", "101"][..], "--nq 101"),
        (&["--batch", "500"][..], "--batch 500 is larger than the 100 queries"),
        (&["--ks", "10,0"][..], "-k must be at least 1"),
    ] {
        let mut all = vec!["bench", "--backend", "cpu"];
        all.extend_from_slice(args);
        let out = run(&all, &[]);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let (base, query) = (sift("siftsmall_base.fvecs"), sift("siftsmall_query.fvecs"));
    let out = run(&["search", "--base", &base, "--query", &query, "-k", "0"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-k must be at least 1"), "{}", stderr(&out));
}

#[test]
fn bench_json_reports_the_effective_k_and_p99_only_over_enough_calls() {
    let dir = data_dir().join("siftsmall");
    let base = dir.join("siftsmall_base.fvecs");
    let query = dir.join("siftsmall_query.fvecs");
    let (base, query) = (base.to_str().expect("utf-8"), query.to_str().expect("utf-8"));
    // The whole base as k: every vector comes back, and k is reported as what was searched.
    let out = run(
        &[
            "bench",
            "--base",
            base,
            "--query",
            query,
            "--nq",
            "2",
            "-k",
            "20000",
            "--json",
            "--backend",
            "cpu",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json = stdout(&out);
    assert_eq!(field(&json, "k"), 10_000.0, "{json}");
    assert_eq!(field(&json, "k_requested"), 20_000.0, "{json}");
    assert!(field(&json, "rounds") >= 3.0, "{json}");
    // One call per pass: p99 exactly where at least 100 calls were timed (a fast machine
    // makes them within the timed second, a slow one does not).
    let p99_given = !json.contains(r#""p99_ms":null"#);
    assert_eq!(p99_given, field(&json, "calls") >= 100.0, "{json}");
    let out = run(&["bench", "--batch", "1", "--json", "--backend", "cpu"], &[]);
    let json = stdout(&out);
    assert!(field(&json, "calls") >= 100.0 && field(&json, "p99_ms") > 0.0, "{json}");
}

#[test]
fn ground_truth_that_cannot_answer_is_an_error_unless_recall_is_computed() {
    let scratch = Scratch::new("groundtruth");
    let (base, query) = (sift("siftsmall_base.fvecs"), sift("siftsmall_query.fvecs"));
    let good: Vec<Vec<i32>> = (0..100).map(|q| (0..10).map(|i| q * 10 + i).collect()).collect();
    let mut negative = good.clone();
    negative[42][3] = -1;
    let mut beyond = good.clone();
    beyond[7][0] = 10_000;
    let short_rows = scratch.ivecs("rows.ivecs", &good[..50]);
    let short_columns =
        scratch.ivecs("cols.ivecs", &good.iter().map(|r| r[..5].to_vec()).collect::<Vec<_>>());
    for (truth, says) in [
        (scratch.ivecs("negative.ivecs", &negative), "row 42, column 3 holds id -1"),
        (scratch.ivecs("beyond.ivecs", &beyond), "row 7, column 0 holds id 10000"),
        (short_rows.clone(), "has 50 rows, but 100 queries"),
        (short_columns.clone(), "fewer than k = 10"),
    ] {
        let out = run(
            &["bench", "--base", &base, "--query", &query, "--groundtruth", &truth, "--backend", "cpu"],
            &[],
        );
        assert!(!out.status.success(), "{says}: must be refused");
        let err = stderr(&out);
        assert!(err.contains(says) && err.contains(&truth), "{err}");
    }
    // Asked for, the computed ground truth replaces a file that cannot answer.
    let out = run(
        &[
            "bench",
            "--base",
            &base,
            "--query",
            &query,
            "--groundtruth",
            &short_columns,
            "--exact-recall",
            "--json",
            "--backend",
            "cpu",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json = stdout(&out);
    assert_eq!(field(&json, "recall"), 1.0);
    assert!(json.contains("f64 brute force"), "{json}");
}

/// Outside a desktop session Mesa's device-select layer made libwayland print
/// "XDG_RUNTIME_DIR is invalid or not set" on every Vulkan enumeration.
#[test]
fn no_wayland_noise_outside_a_desktop_session() {
    let mut command = Command::new(binary());
    command
        .arg("info")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .env_remove("HIVE_GPU_BACKEND");
    let out = command.output().expect("the hive-gpu binary runs");
    assert!(out.status.success());
    let err = stderr(&out);
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
}

#[test]
fn a_collection_built_with_an_index_says_so_and_searches_through_it_or_exactly_on_request() {
    let scratch = Scratch::new("indexed");
    let coll = scratch.0.join("sift-ivf.hgc");
    let coll = coll.to_str().expect("utf-8");
    let (base, query) = (sift("siftsmall_base.fvecs"), sift("siftsmall_query.fvecs"));
    let built = run(
        &["build", "--base", &base, "--out", coll, "--index", "ivf-flat:nlist=64", "--backend", "cpu"],
        &[],
    );
    assert!(built.status.success(), "{}", stderr(&built));
    let info = run(&["info", "--collection", coll], &[]);
    let text = stdout(&info);
    assert!(
        text.contains("format version  2") && text.contains("index           ivf-flat:nlist=64"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("index ")), "no index section in\n{text}");
    let search = |extra: &[&str]| {
        let mut all = vec!["search", "--collection", coll, "--query", &query, "-k", "10", "--backend", "cpu"];
        all.extend_from_slice(extra);
        let out = run(&all, &[]);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        stdout(&out)
    };
    let exact = search(&["--search", "exact"]);
    // Every list probed is the exact search; one list is not.
    assert_eq!(search(&["--search", "nprobe=64"]), exact);
    assert_ne!(search(&["--search", "nprobe=1"]), exact);
    let from_base = run(&["search", "--base", &base, "--query", &query, "-k", "10", "--backend", "cpu"], &[]);
    assert_eq!(stdout(&from_base), exact);
    let bad = run(&["search", "--collection", coll, "--query", &query, "--search", "nprobe=0"], &[]);
    assert!(!bad.status.success() && stderr(&bad).contains("nprobe"), "{}", stderr(&bad));
}

#[test]
fn a_built_collection_file_is_described_and_searched_like_its_base() {
    let scratch = Scratch::new("collection");
    let coll = scratch.0.join("sift.hgc");
    let coll = coll.to_str().expect("utf-8");
    let (base, query) = (sift("siftsmall_base.fvecs"), sift("siftsmall_query.fvecs"));
    let built =
        run(&["build", "--base", &base, "--out", coll, "--precision", "f16", "--backend", "cpu"], &[]);
    assert!(built.status.success(), "{}", stderr(&built));
    assert!(stdout(&built).contains("10000 vectors of 128"), "{}", stdout(&built));

    let info = run(&["info", "--collection", coll], &[]);
    assert!(info.status.success(), "{}", stderr(&info));
    let text = stdout(&info);
    for line in
        ["format version  1", "dimension       128", "storage         F16", "10000 live of 10000 slots"]
    {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    for section in ["config", "ids", "vectors", "removed", "metadata", "payload"] {
        assert!(text.lines().any(|l| l.starts_with(section)), "no {section} section in\n{text}");
    }

    // The file answers exactly what the same vectors stored in f16 answer.
    let from_file =
        run(&["search", "--collection", coll, "--query", &query, "-k", "5", "--backend", "cpu"], &[]);
    let from_base = run(
        &["search", "--base", &base, "--query", &query, "-k", "5", "--precision", "f16", "--backend", "cpu"],
        &[],
    );
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(stdout(&from_file), stdout(&from_base));

    // bench opens the file (its f16 storage applies), measures recall against the ground
    // truth and against a brute force over the file's own rows, and says it opened it.
    let gt = sift("siftsmall_groundtruth.ivecs");
    for extra in [&["--groundtruth", gt.as_str()][..], &["--exact-recall"][..]] {
        let mut args = vec![
            "bench",
            "--collection",
            coll,
            "--query",
            &query,
            "--backend",
            "cpu",
            "--json",
            "--nq",
            "20",
        ];
        args.extend_from_slice(extra);
        let bench = run(&args, &[]);
        assert!(bench.status.success(), "{}", stderr(&bench));
        let json = stdout(&bench);
        assert!(json.contains("\"build\":\"open\"") && json.contains("\"precision\":\"f16\""), "{json}");
        assert!(field(&json, "recall") >= 0.99, "{json}");
    }
    let alone = run(&["bench", "--query", &query, "--backend", "cpu"], &[]);
    assert!(!alone.status.success() && stderr(&alone).contains("--query needs --base or --collection"));

    // A damaged file is refused by name, with where it went wrong.
    let mut image = std::fs::read(coll).expect("the file");
    image.truncate(image.len() / 2);
    std::fs::write(coll, image).expect("truncate");
    let damaged = run(&["info", "--collection", coll], &[]);
    assert!(!damaged.status.success());
    let err = stderr(&damaged);
    assert!(err.contains("sift.hgc") && err.contains("header at byte 24"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bench_multi_on_two_logical_shards_finds_every_query_equal_to_one_device() {
    let out = run(
        &[
            "bench-multi",
            "--devices",
            "cpu:0,cpu:0",
            "--rows",
            "3000",
            "--dim",
            "20",
            "--queries",
            "200",
            "--singles",
            "5",
            "--repeat",
            "1",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let layout = |name: &str| {
        *lines
            .iter()
            .find(|l| l.contains(&format!("\"layout\":\"{name}\"")))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(field(layout("replicated"), "queries_differing"), 0.0, "{text}");
    assert_eq!(field(layout("sharded-against-one"), "queries_differing"), 0.0, "{text}");
    assert_eq!(field(layout("sharded"), "rows"), 6000.0);
    let summary = lines.last().expect("a summary");
    assert!(field(summary, "replicated_qps_over_one") > 0.0, "{summary}");
    // A device list that names no device is refused by name.
    let out = run(&["bench-multi", "--devices", "cpu:7", "--rows", "10"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("7"), "{}", stderr(&out));
}

#[test]
fn info_describes_a_sharded_collections_manifest_and_opens_it() {
    // Found from the working directory, as every test finds its data: a path fixed at build
    // time is wrong wherever the binary runs from another checkout (the GPU machine's).
    let manifest = data_dir().join("../crates/hive-gpu/tests/data/formats/sharded/sharded.hgs");
    let path = manifest.to_str().expect("a UTF-8 path");
    let out = run(&["info", "--collection", path, "--open", "--backend", "cpu"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("a sharded collection's manifest"), "{text}");
    assert!(text.contains("shards          2"), "{text}");
    assert!(text.contains("opened"), "{text}");
}

#[test]
fn search_reads_a_sharded_collections_manifest_and_names_a_dimension_mismatch() {
    // The released sharded format's files: 12-dimensional, cosine, f16 (the library's tests check
    // its answers against one collection's; here, that the CLI opens and searches it).
    let manifest = data_dir().join("../crates/hive-gpu/tests/data/formats/sharded/sharded.hgs");
    let manifest = manifest.to_str().expect("a UTF-8 path");
    let dir = std::env::temp_dir().join(format!("hive-gpu-cli-sharded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let queries = dir.join("q.fvecs");
    let rows: Vec<Vec<f32>> =
        (0..3).map(|i| (0..12).map(|d| ((i * 5 + d) % 7) as f32 - 3.0).collect()).collect();
    let mut bytes = Vec::new();
    for row in &rows {
        bytes.extend_from_slice(&12i32.to_le_bytes());
        row.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    }
    std::fs::write(&queries, bytes).expect("the queries");
    let out = run(
        &[
            "search",
            "--collection",
            manifest,
            "--query",
            queries.to_str().expect("utf-8"),
            "-k",
            "4",
            "--json",
            "--backend",
            "cpu",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.lines().all(|l| l.contains("\"ids\":[\"")), "{text}");
    // A query of another dimension names both files.
    let out = run(
        &[
            "search",
            "--collection",
            manifest,
            "--query",
            &sift("siftsmall_query.fvecs"),
            "-k",
            "1",
            "--backend",
            "cpu",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("dimension mismatch"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
