//! Search structures, written once over the backend op set: exact (flat) search, k-means and
//! the IVF indexes it trains (IVF-Flat, IVF-SQ8 and the flat SQ8 index over one list); product
//! quantization and graph indexes will sit beside them.

pub(crate) mod flat;
pub(crate) mod ivf;
pub(crate) mod kmeans;
pub(crate) mod spec;
pub(crate) mod sq;
