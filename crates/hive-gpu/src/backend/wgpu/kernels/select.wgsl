// Top-k selection on the GPU for the wgpu backend: a radix select finds each query's k-th
// approximate distance exactly (4 passes of 8 bits over sortable keys), then every row inside
// the error band of it becomes a candidate. Only the candidates are read back.

struct Params {
    n_rows: u32,
    row_offset: u32,
    dim: u32,
    nq: u32,
    metric: u32,
    stride: u32,
    shift: u32,
    cap: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dist: array<f32>;
// Per query: prefix, mask, remaining k, candidate count.
@group(0) @binding(2) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> cand: array<u32>;
// Per query: the band's multiplier and addend (see the host's bounds).
@group(0) @binding(5) var<storage, read> gate: array<vec2<f32>>;

var<workgroup> local_hist: array<atomic<u32>, 256>;

fn key_of(a: f32) -> u32 {
    let b = bitcast<u32>(a);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value_of(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// grid (x, nq), any x: histogram of the current digit among keys matching the prefix. Rows are
// visited in a grid-stride loop, so collections of any size fit the dispatch limit.
@compute @workgroup_size(256)
fn radix_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    atomicStore(&local_hist[lid.x], 0u);
    workgroupBarrier();
    let q = wg.y;
    let prefix = atomicLoad(&state[q * 4u]);
    let mask = atomicLoad(&state[q * 4u + 1u]);
    for (var i = wg.x * 256u + lid.x; i < p.n_rows; i += groups.x * 256u) {
        let key = key_of(dist[q * p.stride + i]);
        if ((key & mask) == prefix) {
            atomicAdd(&local_hist[(key >> p.shift) & 255u], 1u);
        }
    }
    workgroupBarrier();
    let count = atomicLoad(&local_hist[lid.x]);
    if (count > 0u) {
        atomicAdd(&hist[q * 256u + lid.x], count);
    }
}

// grid (nq): picks the digit holding the remaining k-th key, clears the histogram.
@compute @workgroup_size(1)
fn radix_pick(@builtin(workgroup_id) wg: vec3<u32>) {
    let q = wg.x;
    let remaining = atomicLoad(&state[q * 4u + 2u]);
    var below = 0u;
    var digit = 255u;
    var found = false;
    for (var b = 0u; b < 256u; b++) {
        let h = atomicLoad(&hist[q * 256u + b]);
        if (!found && below + h >= remaining) {
            digit = b;
            found = true;
        }
        if (!found) { below += h; }
        atomicStore(&hist[q * 256u + b], 0u);
    }
    atomicOr(&state[q * 4u], digit << p.shift);
    atomicOr(&state[q * 4u + 1u], 255u << p.shift);
    atomicStore(&state[q * 4u + 2u], remaining - below);
}

// grid (x, nq), any x: rows within the band of the k-th distance become candidates; the count
// keeps growing past `cap` so the host sees an overflow.
@compute @workgroup_size(256)
fn collect(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let q = gid.y;
    let kth = value_of(atomicLoad(&state[q * 4u]));
    let g = gate[q];
    let r = kth * g.x + g.y;
    let band = r + abs(r) * 4.76837158203125e-07 + 1e-37;
    for (var i = gid.x; i < p.n_rows; i += groups.x * 256u) {
        if (dist[q * p.stride + i] <= band) {
            let pos = atomicAdd(&state[q * 4u + 3u], 1u);
            if (pos < p.cap) {
                cand[q * p.cap + pos] = i;
            }
        }
    }
}
