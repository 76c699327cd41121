//! Which shard owns an id: weighted rendezvous hashing over a stable hash of the id's bytes.
//!
//! Every id has one owner, computed from the id alone (no table of ids), so an upsert of an id
//! that is already stored lands on the shard that holds it and replaces it there, and a removal
//! goes straight to its shard. Shard `s` receives a share `weights[s] / sum(weights)` of ids
//! (the weights are the devices' free memory when the storage was created, or the caller's),
//! and the owner of an id never changes while the weights stay: they are saved in the
//! manifest, and the hash below is part of the file format (`docs/FORMAT.md`), so the same id
//! routes to the same shard on every machine and in every later version.
//!
//! Rendezvous (highest random weight) hashing: shard `s` scores an id `-weights[s] / ln(u)`,
//! with `u` uniform in (0, 1) drawn from the hash of the id and `s`; the highest score owns it.
//! For independent `u`, `P(s wins)` is exactly `weights[s] / sum(weights)` (Schindelhauer and
//! Schomaker, "Weighted distributed hash tables", 2005).

/// Routes ids to shards.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Router {
    weights: Vec<f64>,
    seed: u64,
}

/// FNV-1a over the id's bytes: stable across platforms and versions (the format depends on it).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the whole word.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Router {
    /// A router over shards of these weights (each finite and positive; the caller checks).
    pub(crate) fn new(weights: Vec<f64>, seed: u64) -> Self {
        Self { weights, seed }
    }

    /// The shards' weights, in shard order.
    pub(crate) fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The routing hash's seed.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// The shard that owns `id`.
    pub(crate) fn shard_of(&self, id: &str) -> usize {
        if self.weights.len() == 1 {
            return 0;
        }
        let key = fnv1a(id.as_bytes()) ^ self.seed;
        let mut best = (0, f64::NEG_INFINITY);
        for (shard, &weight) in self.weights.iter().enumerate() {
            let draw = mix(key ^ mix(shard as u64 + 1));
            // 53 bits into (0, 1): never 0, so ln(u) < 0 and the score is finite and positive.
            let u = ((draw >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let score = -weight / u.ln();
            if score > best.1 {
                best = (shard, score);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(router: &Router, ids: usize) -> Vec<f64> {
        let mut counts = vec![0usize; router.weights().len()];
        for i in 0..ids {
            counts[router.shard_of(&format!("id-{i}"))] += 1;
        }
        counts.into_iter().map(|c| c as f64 / ids as f64).collect()
    }

    #[test]
    fn each_shard_receives_its_weights_share_of_ids() {
        for weights in [vec![1.0, 1.0], vec![1.0, 1.0, 1.0, 1.0], vec![3.0, 1.0], vec![80e9, 40e9, 20e9]] {
            let router = Router::new(weights.clone(), 0);
            let total: f64 = weights.iter().sum();
            let got = shares(&router, 200_000);
            for (s, (&share, &weight)) in got.iter().zip(&weights).enumerate() {
                let want = weight / total;
                // 200,000 draws: the standard deviation of a share is under 0.0012.
                assert!(
                    (share - want).abs() < 0.006,
                    "weights {weights:?}: shard {s} got {share}, wants {want}"
                );
            }
        }
    }

    #[test]
    fn the_route_is_a_function_of_the_id_the_weights_and_the_seed_alone() {
        let router = Router::new(vec![1.0, 2.0, 3.0], 9);
        let again = Router::new(vec![1.0, 2.0, 3.0], 9);
        for i in 0..1000 {
            let id = format!("{i}");
            assert_eq!(router.shard_of(&id), again.shard_of(&id));
        }
        // The format depends on these exact values: a change to the hash would send stored
        // ids to other shards than the ones holding them.
        let pinned = Router::new(vec![1.0, 1.0, 1.0, 1.0], 0);
        let routes: Vec<usize> =
            ["a", "b", "c", "vector-17", "", "\u{e9}t\u{e9}"].iter().map(|id| pinned.shard_of(id)).collect();
        assert_eq!(routes, PINNED_ROUTES);
    }

    /// Where the first build that sharded (format version 3) sent these ids: every later build
    /// must send them there too, or it cannot open that build's files.
    const PINNED_ROUTES: [usize; 6] = [2, 3, 3, 0, 3, 3];

    #[test]
    fn one_shard_owns_everything() {
        let router = Router::new(vec![5.0], 3);
        assert!((0..100).all(|i| router.shard_of(&i.to_string()) == 0));
    }
}
