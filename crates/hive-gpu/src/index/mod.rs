//! Search structures, written once over the backend op set. Only exact (flat) search exists
//! today; IVF, PQ and graph indexes will sit beside it.

pub(crate) mod flat;
