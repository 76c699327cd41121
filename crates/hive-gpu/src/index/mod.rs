//! Search structures, written once over the backend op set: exact (flat) search, k-means and
//! the IVF-Flat index it trains; quantized IVF lists and graph indexes will sit beside them.

pub(crate) mod flat;
pub(crate) mod ivf;
pub(crate) mod kmeans;
pub(crate) mod spec;
