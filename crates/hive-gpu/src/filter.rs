//! [`Filter`]: which vectors a search may return, by id and by payload predicates. A filter
//! becomes a [`SlotSet`] through the payload indexes (`crate::payload`), and the search reads
//! that set on the device like its removed rows.

use std::ops::{Bound, RangeBounds};

use rayon::prelude::*;

use crate::error::{HiveGpuError, Result};
use crate::payload::{PayloadIndex, PayloadValue};
use crate::slots::SlotSet;

/// How deeply a [`Filter`] may nest (`And`, `Or` and `Not` each add a level).
pub const MAX_FILTER_DEPTH: usize = 128;

/// Allow-lists of at least this many ids are looked up on every core. Each lookup is a
/// probe of the id map at a random place (a cache miss over a large collection): a filter of
/// 900,000 ids evaluated for each search made a 10,000-query CUDA batch over 1M rows 4-6x
/// slower than the unfiltered one on the H100 machine, where a prepared filter made it faster
/// (docs/PERFORMANCE.md, filters evaluated by every search).
const PARALLEL_IDS: usize = 8192;

/// Which vectors a search may return. Searches with a filter are exact: they return the true
/// k nearest among the vectors that pass, or all of them when fewer than k pass.
///
/// Fields are looked up in a vector's typed payload (`GpuVector::payload`) and in its string
/// metadata (`GpuVector::metadata`, whose values are string fields). A vector without the
/// field, or with a value of another type, does not match a predicate on it (and so matches
/// its negation). Integers and floats compare by value.
///
/// ```
/// use hive_gpu::{Filter, GpuContext, GpuBackendType, GpuDistanceMetric, GpuVector, PayloadValue};
///
/// let context = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
/// let storage = context.create_storage(2, GpuDistanceMetric::Euclidean)?;
/// storage.add_vectors(&[
///     GpuVector::new("a", vec![0.0, 0.0]).with_field("color", "red").with_field("price", 10),
///     GpuVector::new("b", vec![0.1, 0.0]).with_field("color", "blue").with_field("price", 25.5),
///     GpuVector::new("c", vec![0.2, 0.0]).with_field("color", "red").with_field("price", 40),
/// ])?;
/// let red_under_30 = Filter::eq("color", "red").and(Filter::range("price", ..30.0));
/// let hits = storage.search_filtered(&[0.0, 0.0], 10, &red_under_30)?;
/// assert_eq!(hits.len(), 1);
/// assert_eq!(hits[0].id, "a");
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Filter {
    /// Every vector.
    All,
    /// Only the vectors with these ids (an allow-list; unknown ids are ignored).
    Ids(Vec<String>),
    /// Vectors whose field equals the value.
    Equals(String, PayloadValue),
    /// Vectors whose field equals one of the values.
    AnyOf(String, Vec<PayloadValue>),
    /// Vectors whose numeric field lies within the bounds.
    Range(String, Bound<f64>, Bound<f64>),
    /// Vectors that have the field, whatever its value.
    Has(String),
    /// Vectors that pass every filter (`All` when empty).
    And(Vec<Filter>),
    /// Vectors that pass at least one filter (none when empty).
    Or(Vec<Filter>),
    /// Vectors that do not pass the filter.
    Not(Box<Filter>),
    /// A filter already turned into slots for one collection
    /// (`GpuVectorStorage::prepare_filter`): searches of that collection read the slots as they
    /// are while it has not changed, and evaluate the filter again once it has.
    Prepared(PreparedFilter),
}

/// A [`Filter`] evaluated once against one collection (or once against each shard or replica
/// of a multi-device collection), so that many searches (one query at a time, say) do not each
/// turn it into slots again: an allow-list of a million ids costs tens of milliseconds to look
/// up, a search a fraction of one. Cheap to clone (the slots are shared).
#[derive(Debug, Clone)]
pub struct PreparedFilter {
    filter: Box<Filter>,
    /// The slots of each collection it was prepared for, with the version they were computed
    /// at.
    prepared: Vec<PreparedSlots>,
}

/// One collection's slots of a [`PreparedFilter`].
#[derive(Debug, Clone)]
struct PreparedSlots {
    collection: u64,
    version: u64,
    slots: std::sync::Arc<SlotSet>,
}

impl PreparedFilter {
    pub(crate) fn new(filter: Filter, collection: u64, version: u64, slots: SlotSet) -> Self {
        let prepared = vec![PreparedSlots { collection, version, slots: std::sync::Arc::new(slots) }];
        Self { filter: Box::new(filter), prepared }
    }

    /// One filter prepared for several collections (the shards or replicas of one storage),
    /// each by [`PreparedFilter::new`] from the same filter.
    pub(crate) fn combine(parts: Vec<PreparedFilter>) -> Option<Self> {
        let mut parts = parts.into_iter();
        let mut first = parts.next()?;
        for part in parts {
            first.prepared.extend(part.prepared);
        }
        Some(first)
    }

    /// Its slots, if it was prepared for this collection at this version.
    pub(crate) fn current_slots(&self, collection: u64, version: u64) -> Option<&SlotSet> {
        self.prepared.iter().find(|p| p.collection == collection && p.version == version).map(|p| &*p.slots)
    }

    /// The filter it was prepared from.
    pub fn filter(&self) -> &Filter {
        &self.filter
    }

    /// Vectors that passed when it was prepared (removed ones included until the collection
    /// changes), over every collection it was prepared for.
    pub fn count(&self) -> usize {
        self.prepared.iter().map(|p| p.slots.count()).sum()
    }
}

/// Prepared filters are equal when their filters are.
impl PartialEq for PreparedFilter {
    fn eq(&self, other: &Self) -> bool {
        self.filter == other.filter
    }
}

/// The collection a filter is evaluated against: its payload indexes, its ids, and which
/// collection and version it is (for [`Filter::Prepared`]).
pub(crate) struct Target<'a> {
    pub(crate) len: usize,
    pub(crate) index: &'a PayloadIndex,
    pub(crate) slot_of: &'a (dyn Fn(&str) -> Option<usize> + Sync),
    pub(crate) collection: u64,
    pub(crate) version: u64,
}

impl Filter {
    /// Only the vectors with these ids.
    pub fn ids<S: AsRef<str>>(ids: &[S]) -> Self {
        Self::Ids(ids.iter().map(|s| s.as_ref().to_string()).collect())
    }

    /// Every vector but those with these ids (a deny-list).
    pub fn exclude_ids<S: AsRef<str>>(ids: &[S]) -> Self {
        Self::Not(Box::new(Self::ids(ids)))
    }

    /// Vectors whose `field` equals `value`.
    pub fn eq(field: impl Into<String>, value: impl Into<PayloadValue>) -> Self {
        Self::Equals(field.into(), value.into())
    }

    /// Vectors whose `field` equals one of `values`.
    pub fn any_of<V: Into<PayloadValue>>(
        field: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        Self::AnyOf(field.into(), values.into_iter().map(Into::into).collect())
    }

    /// Vectors whose numeric `field` lies in `range` (`10.0..20.0`, `..=5.0`, `3.0..`).
    pub fn range(field: impl Into<String>, range: impl RangeBounds<f64>) -> Self {
        Self::Range(field.into(), range.start_bound().cloned(), range.end_bound().cloned())
    }

    /// Vectors that have `field`.
    pub fn has(field: impl Into<String>) -> Self {
        Self::Has(field.into())
    }

    /// Vectors that pass both.
    pub fn and(self, other: Filter) -> Self {
        match self {
            Self::And(mut all) => {
                all.push(other);
                Self::And(all)
            }
            first => Self::And(vec![first, other]),
        }
    }

    /// Vectors that pass either.
    pub fn or(self, other: Filter) -> Self {
        match self {
            Self::Or(mut any) => {
                any.push(other);
                Self::Or(any)
            }
            first => Self::Or(vec![first, other]),
        }
    }

    /// Vectors that do not pass this filter.
    #[allow(clippy::should_implement_trait)]
    pub fn not(self) -> Self {
        Self::Not(Box::new(self))
    }

    /// The slots of `0..len` that pass, with `slot_of` finding an id's slot. Removed slots may
    /// be members: the search intersects with the live rows. A filter nested deeper than
    /// [`MAX_FILTER_DEPTH`] is refused (evaluation recurses once per level).
    pub(crate) fn slots(&self, target: &Target<'_>) -> Result<SlotSet> {
        self.slots_at(0, target)
    }

    fn slots_at(&self, depth: usize, target: &Target<'_>) -> Result<SlotSet> {
        let Target { len, index, slot_of, .. } = *target;
        if depth > MAX_FILTER_DEPTH {
            return Err(HiveGpuError::InvalidArgument(format!(
                "the filter nests deeper than {MAX_FILTER_DEPTH} levels"
            )));
        }
        let inner = |f: &Filter| f.slots_at(depth + 1, target);
        Ok(match self {
            Self::All => SlotSet::full(len),
            Self::Ids(ids) if ids.len() >= PARALLEL_IDS => {
                let found: Vec<usize> =
                    crate::exec::run(|| ids.par_iter().filter_map(|id| slot_of(id)).collect())?;
                SlotSet::from_slots(len, found)
            }
            Self::Ids(ids) => SlotSet::from_slots(len, ids.iter().filter_map(|id| slot_of(id))),
            Self::Equals(field, value) => index.equal(len, field, value),
            Self::AnyOf(field, values) => values
                .iter()
                .map(|v| index.equal(len, field, v))
                .reduce(|a, b| a.or(&b))
                .unwrap_or_else(|| SlotSet::empty(len)),
            Self::Range(field, low, high) => index.range(len, field, *low, *high),
            Self::Has(field) => index.has(len, field),
            Self::And(all) => {
                let mut set = SlotSet::full(len);
                for f in all {
                    set = set.and(&inner(f)?);
                }
                set
            }
            Self::Or(any) => {
                let mut set = SlotSet::empty(len);
                for f in any {
                    set = set.or(&inner(f)?);
                }
                set
            }
            Self::Not(negated) => inner(negated)?.complement(len),
            Self::Prepared(prepared) => match prepared.current_slots(target.collection, target.version) {
                Some(slots) => SlotSet::clone(slots),
                None => inner(&prepared.filter)?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_allow_list_looked_up_on_every_core_finds_what_one_thread_finds() {
        let len = 3 * PARALLEL_IDS;
        let index = PayloadIndex::default();
        // Ids "v<n>" of slot n, except every third slot; other ids are unknown.
        let slot_of =
            |id: &str| id.strip_prefix('v')?.parse::<usize>().ok().filter(|&n| n < len && n % 3 != 0);
        let target = Target { len, index: &index, slot_of: &slot_of, collection: 0, version: 0 };
        for count in [PARALLEL_IDS - 1, PARALLEL_IDS, 2 * PARALLEL_IDS + 5] {
            // Unknown ids, ids past the slots, repeats and gaps, on both sides of the threshold.
            let ids: Vec<String> = (0..count)
                .map(|i| {
                    if i % 7 == 0 { format!("unknown{i}") } else { format!("v{}", (i * 7919) % (len + 100)) }
                })
                .collect();
            let got: Vec<usize> = Filter::ids(&ids).slots(&target).expect("evaluates").iter().collect();
            let mut want: Vec<usize> = ids.iter().filter_map(|id| slot_of(id)).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(got, want, "{count} ids");
        }
    }
}
