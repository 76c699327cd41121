// Top-k selection on the GPU for the wgpu backend: a radix select finds each query's k-th
// approximate distance exactly (4 passes of 8 bits over sortable keys), then every row inside
// the error band of it becomes a candidate. Only the candidates are read back. `common.wgsl`
// comes first.

@group(0) @binding(1) var<storage, read> dist: array<f32>;
// Per query: prefix, mask, remaining k, candidate count.
@group(0) @binding(2) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> cand: array<u32>;
// Per query: the band's multiplier and addend (see the host's bounds).
@group(0) @binding(5) var<storage, read> gate: array<vec2<f32>>;


// grid (x, nq), any x: histogram of the current digit among keys matching the prefix. Rows are
// visited in a grid-stride loop, so collections of any size fit the dispatch limit.
@compute @workgroup_size(256)
fn radix_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    atomicStore(&digit_hist[lid.x], 0u);
    workgroupBarrier();
    let q = wg.y;
    let prefix = atomicLoad(&state[q * 4u]);
    let mask = atomicLoad(&state[q * 4u + 1u]);
    for (var i = wg.x * 256u + lid.x; i < p.n_rows; i += groups.x * 256u) {
        let key = key_of(dist[q * p.stride + i]);
        if ((key & mask) == prefix) {
            atomicAdd(&digit_hist[(key >> p.shift) & 255u], 1u);
        }
    }
    workgroupBarrier();
    let count = atomicLoad(&digit_hist[lid.x]);
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
    let band = band_of(kth, g.x, g.y);
    for (var i = gid.x; i < p.n_rows; i += groups.x * 256u) {
        if (dist[q * p.stride + i] <= band) {
            let pos = atomicAdd(&state[q * 4u + 3u], 1u);
            if (pos < p.cap) {
                cand[q * p.cap + pos] = i;
            }
        }
    }
}

// One workgroup, after `scan_select`: the k-th smallest key over every list (the lists hold
// each workgroup's k best, so also the global k best), then every listed row inside the band
// of it becomes a candidate, in the layout `collect` writes. A list that overflowed makes the
// count exceed `cap`, which sends the query to the host's exact search.
var<workgroup> m_prefix: u32;
var<workgroup> m_mask: u32;
var<workgroup> m_remaining: u32;
var<workgroup> m_overflow: atomic<u32>;

// One round of a one-workgroup radix select over keys (`merge_lists`, `select_lists`): clear
// the histogram, count the digit at `shift` of every key matching the prefix so far, then narrow
// the prefix to the digit holding the `m_remaining`-th key. Every thread calls the first and
// last (they synchronize).
fn clear_digits(lid: u32) {
    atomicStore(&digit_hist[lid], 0u);
    workgroupBarrier();
}

fn count_digit(key: u32, shift: u32) {
    if ((key & m_mask) == m_prefix) {
        atomicAdd(&digit_hist[(key >> shift) & 255u], 1u);
    }
}

fn narrow_prefix(lid: u32, shift: u32) {
    workgroupBarrier();
    let picked = pick_digit(lid, m_remaining);
    if (lid == 0u) {
        m_prefix = m_prefix | (picked.x << shift);
        m_mask = m_mask | (255u << shift);
        m_remaining = m_remaining - picked.y;
    }
    workgroupBarrier();
}

fn list_count(l: u32) -> u32 {
    return bitcast<u32>(dist[l * p.list_words]);
}

fn list_key(l: u32, e: u32) -> u32 {
    return bitcast<u32>(dist[l * p.list_words + 1u + 2u * e]);
}

fn list_slot(l: u32, e: u32) -> u32 {
    return bitcast<u32>(dist[l * p.list_words + 2u + 2u * e]);
}

@compute @workgroup_size(256)
fn merge_lists(@builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        m_prefix = 0u;
        m_mask = 0u;
        m_remaining = p.k;
        atomicStore(&m_overflow, 0u);
    }
    workgroupBarrier();
    for (var l = lid; l < p.lists; l += 256u) {
        if (list_count(l) > p.list_cap) { atomicStore(&m_overflow, 1u); }
    }
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        clear_digits(lid);
        for (var l = lid; l < p.lists; l += 256u) {
            let count = min(list_count(l), p.list_cap);
            for (var e = 0u; e < count; e++) {
                count_digit(list_key(l, e), shift);
            }
        }
        narrow_prefix(lid, shift);
    }
    let band = band_of(value_of(m_prefix), p.gate_mul, p.gate_add);
    for (var l = lid; l < p.lists; l += 256u) {
        let count = min(list_count(l), p.list_cap);
        for (var e = 0u; e < count; e++) {
            if (value_of(list_key(l, e)) <= band) {
                let pos = atomicAdd(&state[3u], 1u);
                if (pos < p.cap) {
                    cand[pos] = list_slot(l, e);
                }
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u && atomicLoad(&m_overflow) != 0u) {
        atomicAdd(&state[3u], p.cap + 1u);
    }
}

// grid (x): after the radix select of each query's `k`-th (here the sample rank's) smallest
// sample distance, its band becomes the query's filter threshold, in state word 1; +inf
// without a sample (`lists` = 0), so every row passes.
@compute @workgroup_size(256)
fn thresholds(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = gid.x;
    if (q >= p.nq) {
        return;
    }
    var tau = bitcast<f32>(0x7f800000u);
    if (p.lists != 0u) {
        let g = gate[q];
        tau = band_of(value_of(atomicLoad(&state[q * 4u])), g.x, g.y);
    }
    atomicStore(&state[q * 4u + 1u], bitcast<u32>(tau));
}

// grid (nq), after the filter: each query's list (at `list_base`, `list_words` words apart: a
// count, then (key, slot) pairs) holds every live row whose approximate distance passed the
// threshold. The k-th smallest of them gives the band, and the listed rows inside the band
// become candidates as `collect` writes them. The candidates are complete only when the band
// ends at or below the threshold (every dropped row lies above it); otherwise, and when the
// list overflowed or holds fewer than k rows, the count exceeds `cap` and the host searches
// the query another way.
var<workgroup> s_count: u32;

@compute @workgroup_size(256)
fn select_lists(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let q = wg.x;
    let base = p.list_base + q * p.list_words;
    if (lid == 0u) {
        s_count = bitcast<u32>(dist[base]);
        m_prefix = 0u;
        m_mask = 0u;
        m_remaining = p.k;
    }
    let count = workgroupUniformLoad(&s_count);
    let usable = count <= p.list_cap && count >= p.k;
    let n = select(0u, count, usable);
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        clear_digits(lid);
        for (var e = lid; e < n; e += 256u) {
            count_digit(bitcast<u32>(dist[base + 1u + 2u * e]), shift);
        }
        narrow_prefix(lid, shift);
    }
    let g = gate[q];
    let band = band_of(value_of(m_prefix), g.x, g.y);
    let tau = bitcast<f32>(atomicLoad(&state[q * 4u + 1u]));
    if (!usable || !(band <= tau)) {
        if (lid == 0u) {
            atomicStore(&state[q * 4u + 3u], p.cap + 1u);
        }
        return;
    }
    for (var e = lid; e < n; e += 256u) {
        let key = bitcast<u32>(dist[base + 1u + 2u * e]);
        if (value_of(key) <= band) {
            let pos = atomicAdd(&state[q * 4u + 3u], 1u);
            if (pos < p.cap) {
                cand[q * p.cap + pos] = bitcast<u32>(dist[base + 2u + 2u * e]);
            }
        }
    }
}
