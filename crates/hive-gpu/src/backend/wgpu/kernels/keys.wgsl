// Sortable keys of distances and the error band, shared by every wgpu kernel module (prepended
// first).

// Distances as u32 keys that sort like the floats (radix selection), and back.
fn key_of(a: f32) -> u32 {
    let b = bitcast<u32>(a);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value_of(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// The upper edge of the error band around a k-th approximate distance: `mul` and `add` come
// from the host's bounds, and the last terms cover this f32 arithmetic's own rounding.
fn band_of(kth: f32, mul: f32, add: f32) -> f32 {
    let r = kth * mul + add;
    return r + abs(r) * 4.76837158203125e-07 + 1e-37;
}
