// The tensor-core filter of the wgpu backend (cooperative matrices, f16 operands, f32 sums).
// A workgroup of four subgroups of 32 lanes takes QT queries and streams row tiles of RT = 32
// rows through workgroup memory; each subgroup keeps the f16 fragments of its 16 * QA queries
// in registers for the whole pass. f32 rows are scaled by a power of two (`x_scale`) and
// rounded to f16 as they are staged; f16 rows are staged as they are.
// - Mode 0 (the sample): the approximate distance of every row of the dispatch (each
//   `row_step`-th row of the chunk), +inf for removed rows, for the radix select of each
//   query's threshold.
// - Mode 1 (the filter): every live row whose approximate distance is at most its query's
//   threshold joins the query's list; the count keeps growing past `cap`, so an overflow shows.
// One power of two scales the whole tile's queries, so that turning sums back into distances
// is one fma per product with per-row factors.
// The Rust side (`filter.rs`) prepends `enable` lines and `keys.wgsl`, sets the constants and
// fills in the unrolled fragment code (`//@HOIST`, `//@MMA`, `//@EMIT`).

struct FilterParams {
    n_rows: u32,         // rows this dispatch reads (sample rows in mode 0)
    first_slot: u32,     // slot of the chunk's first row
    nq: u32,             // queries of the tile
    metric: u32,         // 0 l2, 1 dot, 2 cosine
    mode: u32,           // 0 sample distances, 1 filter lists
    row_step: u32,       // chunk rows from one row of the dispatch to the next
    rows_per_split: u32, // rows of the dispatch per workgroup along y
    out_base: u32,       // mode 0: index of the chunk's first sample row; mode 1: first list word
    out_stride: u32,     // words per query: the sample size, or a list's words (1 + 2 cap)
    cap: u32,            // entries a list holds
    x_scale: f32,        // the power of two f32 rows are scaled by before rounding to f16
    unscale: f32,        // 1 / (query scale * x_scale): scaled sums back to dot products
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
}

@group(0) @binding(0) var<uniform> p: FilterParams;
@group(0) @binding(1) var<storage, read> rows: array<ROW_TYPE>;
@group(0) @binding(2) var<storage, read> scale: array<f32>;
@group(0) @binding(3) var<storage, read> dead: array<u32>;
// The tile's queries in f16, all scaled by one power of two, QT-padded with zeros.
@group(0) @binding(4) var<storage, read> queries: array<f16>;
// Per query: word 1 holds the threshold (as f32 bits), set by `thresholds`.
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>;

const RT: u32 = 32u;
// Staged rows and stored sums are padded so that the 16 rows of a fragment fall on different
// banks of workgroup memory (unpadded, the loads conflicted and the pass took 25% longer).
const XD: u32 = D + 8u;
const CD: u32 = RT + 4u;
var<workgroup> xs: array<f16, RT * XD>;
var<workgroup> cs: array<f32, 64u * CD>;
// Per staged row: the approximate distance is `sum * row_mul + row_add` (one fma per product),
// and whether the row counts.
var<workgroup> row_mul: array<f32, RT>;
var<workgroup> row_add: array<f32, RT>;
var<workgroup> row_live: array<u32, RT>;

fn is_dead(slot: u32) -> bool {
    return ((dead[slot >> 5u] >> (slot & 31u)) & 1u) != 0u;
}

// Per query of the workgroup: its threshold.
var<workgroup> q_tau: array<f32, QT>;

// One subgroup's 16 queries (from `q_local` in the workgroup) by the RT staged rows, stored at
// `cs[sg * 16 * CD]`: lane = row.
fn emit(sg: u32, lane: u32, q0: u32, q_local: u32, r0: u32, r_end: u32) {
    let row = r0 + lane;
    let counts = row < r_end && row_live[lane] != 0u;
    let mul = row_mul[lane];
    let add = row_add[lane];
    let sums = sg * 16u * CD + lane;
    if (p.mode == 0u) {
        if (row < r_end) {
            for (var m = 0u; m < 16u; m++) {
                let q = q0 + q_local + m;
                if (q < p.nq) {
                    let a = fma(cs[sums + m * CD], mul, add);
                    let value = select(bitcast<f32>(0x7f800000u), a, counts);
                    atomicStore(&out[q * p.out_stride + p.out_base + row], bitcast<u32>(value));
                }
            }
        }
        return;
    }
    // The filter: first which of the 16 products pass (a loop without side effects, so its
    // steps overlap), then the rare appends. Queries past the tile have threshold -inf.
    var hits = 0u;
    for (var m = 0u; m < 16u; m++) {
        let a = fma(cs[sums + m * CD], mul, add);
        hits |= select(0u, 1u << m, a <= q_tau[q_local + m]);
    }
    if (!counts) {
        hits = 0u;
    }
    while (hits != 0u) {
        let m = firstTrailingBit(hits);
        hits &= hits - 1u;
        let q = q0 + q_local + m;
        let a = fma(cs[sums + m * CD], mul, add);
        let list = p.out_base + q * p.out_stride;
        if (q >= p.nq) {
            break;
        }
        let pos = atomicAdd(&out[list], 1u);
        if (pos < p.cap) {
            atomicStore(&out[list + 1u + 2u * pos], key_of(a));
            atomicStore(&out[list + 2u + 2u * pos], p.first_slot + row * p.row_step);
        }
    }
}

@compute @workgroup_size(128)
fn filter_rows(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
          @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let q0 = wg.x * QT;
    for (var i = lid; i < QT; i += 128u) {
        var tau = bitcast<f32>(0xff800000u);
        if (q0 + i < p.nq) {
            tau = bitcast<f32>(state[(q0 + i) * 4u + 1u]);
        }
        q_tau[i] = tau;
    }
//@HOIST
    let r_begin = wg.y * p.rows_per_split;
    let r_end = min(p.n_rows, r_begin + p.rows_per_split);
    for (var r0 = r_begin; r0 < r_end; r0 += RT) {
        // The previous tile's fragments and row info have been read.
        workgroupBarrier();
        // A constant trip count: the loads of all steps can be in flight at once.
        for (var n = 0u; n < RT * (D / 4u) / 128u; n++) {
            let i = lid + 128u * n;
            let r = i / (D / 4u);
            let c = i % (D / 4u);
            var v = vec4<f16>(0.0h);
            if (r0 + r < r_end) {
                v = LOAD4((r0 + r) * p.row_step * (D / 4u) + c);
            }
            let o = r * XD + c * 4u;
            xs[o] = v.x;
            xs[o + 1u] = v.y;
            xs[o + 2u] = v.z;
            xs[o + 3u] = v.w;
        }
        if (lid < RT) {
            // L2: |x|^2 - 2 q.x, with |x|^2 from the stored 1 / |x| (the host's gate covers the
            // rounding); dot: -q.x; cosine: -q.x / |x|.
            var mul = -p.unscale;
            var add = 0.0;
            var live = 0u;
            if (r0 + lid < r_end) {
                let chunk_row = (r0 + lid) * p.row_step;
                let s = scale[chunk_row];
                if (p.metric == 0u) {
                    mul = -2.0 * p.unscale;
                    add = select(0.0, 1.0 / (s * s), s > 0.0);
                } else if (p.metric == 2u) {
                    mul = -p.unscale * s;
                }
                live = select(1u, 0u, is_dead(p.first_slot + chunk_row));
            }
            row_mul[lid] = mul;
            row_add[lid] = add;
            row_live[lid] = live;
        }
        workgroupBarrier();
//@MMA
//@EMIT
    }
}
