// Search kernels of the wgpu backend. `ROW(i)` (component i) and `ROW4(w)` (components 4w to
// 4w + 3) are replaced by the storage precision's loads
// (f32 rows, or f16 pairs packed in u32 words) before compilation; `common.wgsl` comes first.

@group(0) @binding(1) var<storage, read> rows: array<ROW_TYPE>;
@group(0) @binding(2) var<storage, read> scale: array<f32>;
@group(0) @binding(3) var<storage, read> dead: array<u32>;
@group(0) @binding(4) var<storage, read> queries: array<f32>;
@group(0) @binding(5) var<storage, read_write> dist: array<f32>;

// Batch tiles: a workgroup of 16 x 16 threads computes 64 queries x 128 rows; each thread
// holds 4 queries x 8 rows in registers, so one workgroup-memory read feeds several products.
// A thread's rows are 16 apart (and its queries too), which keeps neighbouring threads on
// neighbouring words of workgroup memory. Rows are padded to 129 so the transposing stores do
// not collide either.
const STEP: u32 = 16u;
const TQ: u32 = 64u;
const TR: u32 = 128u;
var<workgroup> q_tile: array<array<f32, 64>, 16>;
var<workgroup> r_tile: array<array<f32, 129>, 16>;

fn row_value(i: u32) -> f32 {
    return ROW(i);
}

fn is_dead(slot: u32) -> bool {
    return ((dead[slot >> 5u] >> (slot & 31u)) & 1u) != 0u;
}

// Canonical approximate distance from the raw sum: L2 sums squared differences directly (an
// error relative to the distance), L1 and L-infinity are the distances themselves, dot and
// cosine sum products.
fn finish(raw: f32, chunk_row: u32) -> f32 {
    if (p.metric == 0u || p.metric >= 3u) { return raw; }
    if (p.metric == 1u) { return -raw; }
    return -raw * scale[chunk_row];
}

// Writes one row's four results (queries lid.y + 16 i).
fn store(row: u32, q_first: u32, acc: vec4<f32>) {
    if (row >= p.n_rows) { return; }
    let slot = p.row_offset + row;
    let gone = is_dead(slot);
    for (var i = 0u; i < 4u; i++) {
        let q = q_first + 16u * i;
        if (q < p.nq) {
            var value = finish(acc[i], row);
            if (gone) { value = bitcast<f32>(0x7f800000u); }
            dist[q * p.stride + slot] = value;
        }
    }
}

// Accumulators are named vectors, not arrays: indexed arrays end up in memory on some
// compilers (lavapipe's among them).
@compute @workgroup_size(16, 16)
fn distances(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(local_invocation_index) flat: u32) {
    let q0 = wg.y * TQ;
    let r0 = wg.x * TR;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    // Loader roles: 4 threads per query or row, 4 consecutive components each.
    let part = (flat & 3u) * 4u;
    let who = flat >> 2u;
    let q_load = q0 + who;
    let q_src = min(q_load, p.nq - 1u) * p.dim;
    let r_src0 = min(r0 + who, p.n_rows - 1u) * p.dim;
    let r_src1 = min(r0 + who + 64u, p.n_rows - 1u) * p.dim;
    let r_ok0 = r0 + who < p.n_rows;
    let r_ok1 = r0 + who + 64u < p.n_rows;
    for (var c0 = 0u; c0 < p.dim; c0 += STEP) {
        for (var e = 0u; e < 4u; e++) {
            let c = c0 + part + e;
            let cc = min(c, p.dim - 1u);
            let inside = c < p.dim;
            q_tile[part + e][who] = select(0.0, queries[q_src + cc], q_load < p.nq && inside);
            r_tile[part + e][who] = select(0.0, row_value(r_src0 + cc), r_ok0 && inside);
            r_tile[part + e][who + 64u] = select(0.0, row_value(r_src1 + cc), r_ok1 && inside);
        }
        workgroupBarrier();
        let steps = min(STEP, p.dim - c0);
        if (p.metric == 0u) {
            for (var s = 0u; s < steps; s++) {
                let a = vec4<f32>(q_tile[s][lid.y], q_tile[s][lid.y + 16u], q_tile[s][lid.y + 32u],
                                  q_tile[s][lid.y + 48u]);
                var d = a - vec4<f32>(r_tile[s][lid.x]);
                acc0 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 16u]);
                acc1 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 32u]);
                acc2 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 48u]);
                acc3 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 64u]);
                acc4 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 80u]);
                acc5 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 96u]);
                acc6 += d * d;
                d = a - vec4<f32>(r_tile[s][lid.x + 112u]);
                acc7 += d * d;
            }
        } else if (p.metric == 3u) {
            // L1: the components padding a step beyond dim are zero on both sides.
            for (var s = 0u; s < steps; s++) {
                let a = vec4<f32>(q_tile[s][lid.y], q_tile[s][lid.y + 16u], q_tile[s][lid.y + 32u],
                                  q_tile[s][lid.y + 48u]);
                acc0 += abs(a - vec4<f32>(r_tile[s][lid.x]));
                acc1 += abs(a - vec4<f32>(r_tile[s][lid.x + 16u]));
                acc2 += abs(a - vec4<f32>(r_tile[s][lid.x + 32u]));
                acc3 += abs(a - vec4<f32>(r_tile[s][lid.x + 48u]));
                acc4 += abs(a - vec4<f32>(r_tile[s][lid.x + 64u]));
                acc5 += abs(a - vec4<f32>(r_tile[s][lid.x + 80u]));
                acc6 += abs(a - vec4<f32>(r_tile[s][lid.x + 96u]));
                acc7 += abs(a - vec4<f32>(r_tile[s][lid.x + 112u]));
            }
        } else if (p.metric == 4u) {
            for (var s = 0u; s < steps; s++) {
                let a = vec4<f32>(q_tile[s][lid.y], q_tile[s][lid.y + 16u], q_tile[s][lid.y + 32u],
                                  q_tile[s][lid.y + 48u]);
                acc0 = max(acc0, abs(a - vec4<f32>(r_tile[s][lid.x])));
                acc1 = max(acc1, abs(a - vec4<f32>(r_tile[s][lid.x + 16u])));
                acc2 = max(acc2, abs(a - vec4<f32>(r_tile[s][lid.x + 32u])));
                acc3 = max(acc3, abs(a - vec4<f32>(r_tile[s][lid.x + 48u])));
                acc4 = max(acc4, abs(a - vec4<f32>(r_tile[s][lid.x + 64u])));
                acc5 = max(acc5, abs(a - vec4<f32>(r_tile[s][lid.x + 80u])));
                acc6 = max(acc6, abs(a - vec4<f32>(r_tile[s][lid.x + 96u])));
                acc7 = max(acc7, abs(a - vec4<f32>(r_tile[s][lid.x + 112u])));
            }
        } else {
            for (var s = 0u; s < steps; s++) {
                let a = vec4<f32>(q_tile[s][lid.y], q_tile[s][lid.y + 16u], q_tile[s][lid.y + 32u],
                                  q_tile[s][lid.y + 48u]);
                acc0 += a * r_tile[s][lid.x];
                acc1 += a * r_tile[s][lid.x + 16u];
                acc2 += a * r_tile[s][lid.x + 32u];
                acc3 += a * r_tile[s][lid.x + 48u];
                acc4 += a * r_tile[s][lid.x + 64u];
                acc5 += a * r_tile[s][lid.x + 80u];
                acc6 += a * r_tile[s][lid.x + 96u];
                acc7 += a * r_tile[s][lid.x + 112u];
            }
        }
        workgroupBarrier();
    }
    let q_first = q0 + lid.y;
    store(r0 + lid.x, q_first, acc0);
    store(r0 + lid.x + 16u, q_first, acc1);
    store(r0 + lid.x + 32u, q_first, acc2);
    store(r0 + lid.x + 48u, q_first, acc3);
    store(r0 + lid.x + 64u, q_first, acc4);
    store(r0 + lid.x + 80u, q_first, acc5);
    store(r0 + lid.x + 96u, q_first, acc6);
    store(r0 + lid.x + 112u, q_first, acc7);
}

// One query against every row of a chunk: a thread per row, the query read through the cache
// (for k beyond what `scan_select`'s lists hold).
@compute @workgroup_size(256)
fn scan(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if (row >= p.n_rows) { return; }
    let slot = p.row_offset + row;
    var value = row_distance(row, gid.y * p.dim);
    if (is_dead(slot)) { value = bitcast<f32>(0x7f800000u); }
    dist[gid.y * p.stride + slot] = value;
}

// Single queries, fused: each workgroup scans SELECT_ROWS rows (a thread per row), finds the
// k-th smallest of its distances by a radix select in workgroup memory, and writes to its own
// list every live row within the error band of that k-th. A row left out has k rows of its
// workgroup ahead of it by more than the band, so it cannot be among the global k best: the
// lists hold every candidate, and `merge_lists` needs no other pass over the rows.
// List layout (in `dist`): [count, then (key, slot) pairs], LIST_WORDS apart.
const SELECT_ROWS: u32 = 2048u;
const DEAD_KEY: u32 = 0xff800000u; // key_of(+inf)
var<workgroup> sel_keys: array<u32, 2048>;
var<workgroup> sel_count: atomic<u32>;
var<workgroup> sel_prefix: u32;
var<workgroup> sel_mask: u32;
var<workgroup> sel_remaining: u32;

// `acc` plus four terms of one query (`a`) against one row (`b`), in component order.
fn accumulate4(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    var sum = acc;
    if (p.metric == 0u) {
        let d = a - b;
        sum = sum + d.x * d.x;
        sum = sum + d.y * d.y;
        sum = sum + d.z * d.z;
        sum = sum + d.w * d.w;
    } else if (p.metric == 3u) {
        let d = abs(a - b);
        sum = sum + d.x;
        sum = sum + d.y;
        sum = sum + d.z;
        sum = sum + d.w;
    } else if (p.metric == 4u) {
        let d = abs(a - b);
        sum = max(max(sum, d.x), max(max(d.y, d.z), d.w));
    } else {
        sum = sum + a.x * b.x;
        sum = sum + a.y * b.y;
        sum = sum + a.z * b.z;
        sum = sum + a.w * b.w;
    }
    return sum;
}

// One row against one query. Rows whose length is a multiple of 4 are read 4 components per
// load (`ROW4`): a thread per row touches a different cache line per thread and load, so
// fewer, wider loads are what makes the scan fast. The sum runs over the components in order
// either way.
fn row_distance(row: u32, qbase: u32) -> f32 {
    var acc = 0.0;
    if ((p.dim & 3u) == 0u) {
        let words = p.dim >> 2u;
        let base = row * words;
        for (var w = 0u; w < words; w++) {
            let c = qbase + 4u * w;
            let a = vec4<f32>(queries[c], queries[c + 1u], queries[c + 2u], queries[c + 3u]);
            acc = accumulate4(acc, a, ROW4(base + w));
        }
        return finish(acc, row);
    }
    let base = row * p.dim;
    for (var c = 0u; c < p.dim; c++) {
        let a = queries[qbase + c];
        let b = row_value(base + c);
        if (p.metric == 0u) {
            let d = a - b;
            acc = acc + d * d;
        } else if (p.metric == 3u) {
            acc = acc + abs(a - b);
        } else if (p.metric == 4u) {
            acc = max(acc, abs(a - b));
        } else {
            acc = acc + a * b;
        }
    }
    return finish(acc, row);
}

// The k-th smallest of the workgroup's keys (DEAD_KEY when it holds fewer than k live rows).
fn local_kth(lid: u32, k: u32) -> u32 {
    if (lid == 0u) {
        sel_prefix = 0u;
        sel_mask = 0u;
        sel_remaining = k;
    }
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        atomicStore(&digit_hist[lid], 0u);
        workgroupBarrier();
        let prefix = sel_prefix;
        let mask = sel_mask;
        for (var i = lid; i < SELECT_ROWS; i += 256u) {
            let key = sel_keys[i];
            if ((key & mask) == prefix) {
                atomicAdd(&digit_hist[(key >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        let picked = pick_digit(lid, sel_remaining);
        if (lid == 0u) {
            sel_prefix = sel_prefix | (picked.x << shift);
            sel_mask = sel_mask | (255u << shift);
            sel_remaining = sel_remaining - picked.y;
        }
        workgroupBarrier();
    }
    return sel_prefix;
}

// The second half of `scan_select` (and of `scan_select_wide`), once `sel_keys` holds the
// workgroup's keys: its k-th, and its list of the rows inside that k-th's band.
fn list_band(group: u32, lid: u32) {
    if (lid == 0u) { atomicStore(&sel_count, 0u); }
    workgroupBarrier();
    let kth = local_kth(lid, p.k);
    var band = bitcast<f32>(0x7f800000u);
    if (kth != DEAD_KEY) { band = band_of(value_of(kth), p.gate_mul, p.gate_add); }
    let first = group * SELECT_ROWS;
    let list = (p.list_base + group) * p.list_words;
    for (var i = lid; i < SELECT_ROWS; i += 256u) {
        let key = sel_keys[i];
        if (key != DEAD_KEY && value_of(key) <= band) {
            let pos = atomicAdd(&sel_count, 1u);
            if (pos < p.list_cap) {
                dist[list + 1u + 2u * pos] = bitcast<f32>(key);
                dist[list + 2u + 2u * pos] = bitcast<f32>(p.row_offset + first + i);
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) { dist[list] = bitcast<f32>(atomicLoad(&sel_count)); }
}

// The keys of the workgroup's rows (from `first`) into `sel_keys`, a thread per row.
fn keys_per_thread(first: u32, lid: u32) {
    for (var i = lid; i < SELECT_ROWS; i += 256u) {
        let row = first + i;
        var key = DEAD_KEY;
        if (row < p.n_rows && !is_dead(p.row_offset + row)) {
            key = key_of(row_distance(row, 0u));
        }
        sel_keys[i] = key;
    }
}

@compute @workgroup_size(256)
fn scan_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    keys_per_thread(wg.x * SELECT_ROWS, lid);
    list_band(wg.x, lid);
}
