//! Search structures, written once over the backend op set. Exact (flat) search exists today,
//! and k-means, which the IVF and PQ indexes will train with; graph indexes will sit beside them.

pub(crate) mod flat;
pub(crate) mod kmeans;
