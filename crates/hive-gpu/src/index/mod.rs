//! Search structures, written once over the backend op set: exact (flat) search, k-means and
//! the IVF indexes it trains (IVF-Flat, IVF-SQ8, IVF-PQ, and the flat SQ8, PQ and binary indexes
//! over one list); graph indexes will sit beside them.

pub(crate) mod flat;
pub(crate) mod ivf;
pub(crate) mod kmeans;
pub(crate) mod pq;
pub(crate) mod spec;
pub(crate) mod sq;
