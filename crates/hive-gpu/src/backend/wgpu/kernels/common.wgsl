// Shared by the search and selection modules (prepended to each before compilation, after
// `keys.wgsl`).

struct Params {
    n_rows: u32,        // rows in this dispatch (chunk rows for the search kernels, else all)
    row_offset: u32,    // first slot of the chunk
    dim: u32,
    nq: u32,
    metric: u32,        // 0 l2, 1 dot, 2 cosine, 3 l1, 4 l-infinity
    stride: u32,        // distances per query in `dist` (the collection's slot count)
    shift: u32,         // radix pass: bit position of the digit
    cap: u32,           // candidates kept per query
    // Single-query lists (`scan_select`, `merge_lists`):
    k: u32,
    list_base: u32,     // index of the dispatch's first list
    list_words: u32,    // words per list: a count, then (key, slot) pairs
    lists: u32,         // lists in all
    gate_mul: f32,      // the query's error band (see the host's bounds)
    gate_add: f32,
    list_cap: u32,      // pairs a list holds
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// A workgroup's radix histogram (one 8-bit digit).
var<workgroup> digit_hist: array<atomic<u32>, 256>;

// Running totals of `digit_hist`, and the digit one thread found.
var<workgroup> digit_sums: array<u32, 256>;
var<workgroup> digit_picked: vec2<u32>;

// The digit holding the `remaining`-th smallest of the keys counted in `digit_hist`, and how
// many keys lie in the digits below it (255 and the total when there are fewer keys). Every
// thread of a 256-thread workgroup calls it (it synchronizes): a prefix sum over the digits in
// 8 steps, where one thread scanning them all would take 256.
fn pick_digit(lid: u32, remaining: u32) -> vec2<u32> {
    let count = atomicLoad(&digit_hist[lid]);
    digit_sums[lid] = count;
    workgroupBarrier();
    for (var offset = 1u; offset < 256u; offset <<= 1u) {
        var sum = digit_sums[lid];
        if (lid >= offset) {
            sum += digit_sums[lid - offset];
        }
        workgroupBarrier();
        digit_sums[lid] = sum;
        workgroupBarrier();
    }
    let through = digit_sums[lid];
    let below = through - count;
    if (below < remaining && through >= remaining) {
        digit_picked = vec2<u32>(lid, below);
    }
    if (lid == 255u && through < remaining) {
        digit_picked = vec2<u32>(255u, through);
    }
    workgroupBarrier();
    return digit_picked;
}
