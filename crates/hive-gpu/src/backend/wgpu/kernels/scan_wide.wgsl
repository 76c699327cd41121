// `scan_select` for adapters with subgroups of at least 8 lanes and rows whose length is a
// multiple of 4 (appended to the search module, on a device created with the SUBGROUP feature). Eight lanes share
// a row, each loading every eighth 4-component piece of it, so a subgroup's loads cover whole
// contiguous stretches of rows; with a thread per row every load touched a different cache
// line per thread. The eight partial sums meet by shuffles in the CUDA scan's order (piece
// s + 8j in lane s, then xor 4, 2, 1), which the host's error bound for scans covers.
// Each group of eight takes four rows per round, so more loads are in flight.

fn wide_partial(row: u32, part: u32, words: u32) -> f32 {
    var acc = 0.0;
    let base = row * words;
    for (var w = part; w < words; w += 8u) {
        let c = 4u * w;
        let a = vec4<f32>(queries[c], queries[c + 1u], queries[c + 2u], queries[c + 3u]);
        acc = accumulate4(acc, a, ROW4(base + w));
    }
    return acc;
}

fn wide_sum(partial: f32) -> f32 {
    var acc = partial;
    if (p.metric == 4u) {
        // L-infinity: the lanes' maxima meet by a maximum.
        acc = max(acc, subgroupShuffleXor(acc, 4u));
        acc = max(acc, subgroupShuffleXor(acc, 2u));
        acc = max(acc, subgroupShuffleXor(acc, 1u));
        return acc;
    }
    acc = acc + subgroupShuffleXor(acc, 4u);
    acc = acc + subgroupShuffleXor(acc, 2u);
    acc = acc + subgroupShuffleXor(acc, 1u);
    return acc;
}

fn wide_key(r: u32, first: u32, raw: f32) {
    let row = first + r;
    var key = DEAD_KEY;
    if (row < p.n_rows && !is_dead(p.row_offset + row)) {
        key = key_of(finish(raw, row));
    }
    sel_keys[r] = key;
}

@compute @workgroup_size(256)
fn scan_select_wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32,
                    @builtin(subgroup_id) subgroup: u32, @builtin(num_subgroups) subgroups: u32) {
    let first = wg.x * SELECT_ROWS;
    let words = p.dim >> 2u;
    let part = lane & 7u;
    // Groups of eight lanes, numbered through the subgroups (not by invocation index, whose
    // mapping to lanes Vulkan leaves open).
    let per_subgroup = width >> 3u;
    let group = subgroup * per_subgroup + (lane >> 3u);
    let groups = subgroups * per_subgroup;
    if (groups * 8u != 256u) {
        // Partial subgroups (which no driver is known to form here) would leave rows
        // unassigned: then a thread per row, as `scan_select`.
        keys_per_thread(first, lid);
    } else {
        // Every lane runs the same rounds, so the shuffles see whole subgroups.
        for (var base = 0u; base < SELECT_ROWS; base += 4u * groups) {
            let r0 = base + group;
            let r1 = r0 + groups;
            let r2 = r1 + groups;
            let r3 = r2 + groups;
            var a0 = 0.0;
            var a1 = 0.0;
            var a2 = 0.0;
            var a3 = 0.0;
            if (r0 < SELECT_ROWS && first + r0 < p.n_rows) { a0 = wide_partial(first + r0, part, words); }
            if (r1 < SELECT_ROWS && first + r1 < p.n_rows) { a1 = wide_partial(first + r1, part, words); }
            if (r2 < SELECT_ROWS && first + r2 < p.n_rows) { a2 = wide_partial(first + r2, part, words); }
            if (r3 < SELECT_ROWS && first + r3 < p.n_rows) { a3 = wide_partial(first + r3, part, words); }
            a0 = wide_sum(a0);
            a1 = wide_sum(a1);
            a2 = wide_sum(a2);
            a3 = wide_sum(a3);
            if (part == 0u && r0 < SELECT_ROWS) { wide_key(r0, first, a0); }
            if (part == 0u && r1 < SELECT_ROWS) { wide_key(r1, first, a1); }
            if (part == 0u && r2 < SELECT_ROWS) { wide_key(r2, first, a2); }
            if (part == 0u && r3 < SELECT_ROWS) { wide_key(r3, first, a3); }
        }
    }
    list_band(wg.x, lid);
}
