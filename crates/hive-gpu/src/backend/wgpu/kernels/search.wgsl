// Search kernels of the wgpu backend. `ROW(i)` is replaced by the storage precision's load
// (f32 rows, or f16 pairs packed in u32 words) before compilation.

struct Params {
    n_rows: u32,        // rows in this dispatch (chunk rows for `distances`, all rows otherwise)
    row_offset: u32,    // first slot of the chunk
    dim: u32,
    nq: u32,
    metric: u32,        // 0 l2, 1 dot, 2 cosine
    stride: u32,        // distances per query in `dist` (the collection's slot count)
    shift: u32,         // radix pass: bit position of the digit
    cap: u32,           // candidates kept per query
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rows: array<ROW_TYPE>;
@group(0) @binding(2) var<storage, read> scale: array<f32>;
@group(0) @binding(3) var<storage, read> dead: array<u32>;
@group(0) @binding(4) var<storage, read> queries: array<f32>;
@group(0) @binding(5) var<storage, read_write> dist: array<f32>;

const TILE: u32 = 16u;
var<workgroup> q_tile: array<array<f32, 16>, 16>;
var<workgroup> r_tile: array<array<f32, 16>, 16>;

fn row_value(i: u32) -> f32 {
    return ROW(i);
}

fn is_dead(slot: u32) -> bool {
    return ((dead[slot >> 5u] >> (slot & 31u)) & 1u) != 0u;
}

// Canonical approximate distance from the raw sum: L2 sums squared differences directly (an
// error relative to the distance), dot and cosine sum products.
fn finish(raw: f32, chunk_row: u32) -> f32 {
    if (p.metric == 0u) { return raw; }
    if (p.metric == 1u) { return -raw; }
    return -raw * scale[chunk_row];
}

// Tiled distances: workgroup (16 x 16) computes 16 queries x 16 rows of one row chunk, loading
// both operands through workgroup memory in steps of 16 components.
@compute @workgroup_size(16, 16)
fn distances(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x * TILE + lid.x;
    let q = wg.y * TILE + lid.y;
    var acc = 0.0;
    for (var c0 = 0u; c0 < p.dim; c0 += TILE) {
        // Thread (x, y) loads component c0 + x of query y and of row y of the tile.
        let c = c0 + lid.x;
        let tq = wg.y * TILE + lid.y;
        let tr = wg.x * TILE + lid.y;
        q_tile[lid.y][lid.x] = select(0.0, queries[tq * p.dim + c], tq < p.nq && c < p.dim);
        r_tile[lid.y][lid.x] = select(0.0, row_value(tr * p.dim + c), tr < p.n_rows && c < p.dim);
        workgroupBarrier();
        let steps = min(TILE, p.dim - c0);
        for (var j = 0u; j < steps; j++) {
            let a = q_tile[lid.y][j];
            let b = r_tile[lid.x][j];
            if (p.metric == 0u) {
                let d = a - b;
                acc = acc + d * d;
            } else {
                acc = acc + a * b;
            }
        }
        workgroupBarrier();
    }
    if (q < p.nq && row < p.n_rows) {
        let slot = p.row_offset + row;
        var value = finish(acc, row);
        if (is_dead(slot)) { value = bitcast<f32>(0x7f800000u); }
        dist[q * p.stride + slot] = value;
    }
}

// One query against every row of a chunk: a thread per row, the query read through the cache.
@compute @workgroup_size(256)
fn scan(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if (row >= p.n_rows) { return; }
    let q = gid.y;
    var acc = 0.0;
    let base = row * p.dim;
    let qbase = q * p.dim;
    for (var c = 0u; c < p.dim; c++) {
        let a = queries[qbase + c];
        let b = row_value(base + c);
        if (p.metric == 0u) {
            let d = a - b;
            acc = acc + d * d;
        } else {
            acc = acc + a * b;
        }
    }
    let slot = p.row_offset + row;
    var value = finish(acc, row);
    if (is_dead(slot)) { value = bitcast<f32>(0x7f800000u); }
    dist[q * p.stride + slot] = value;
}
