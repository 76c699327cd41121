//! Index specifications as values and as strings: what `hive-gpu bench --index`, a config file
//! or a Python caller names (`"flat"`, `"ivf-flat:nlist=1024"`, `"ivf-sq8:nlist=1024"`, `"sq8"`,
//! `"binary"`).

use crate::error::{HiveGpuError, Result};

/// Which index a collection's searches go through, with its build parameters.
///
/// As a string: the kind, then `:` and comma-separated `name=value` parameters.
///
/// ```
/// use hive_gpu::IndexSpec;
/// let spec: IndexSpec = "ivf-flat:nlist=1024".parse()?;
/// assert_eq!(spec, IndexSpec::IvfFlat { nlist: 1024 });
/// assert_eq!(spec.to_string(), "ivf-flat:nlist=1024");
/// assert!("ivf-flat:nlist=0".parse::<IndexSpec>().is_err());
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IndexSpec {
    /// Exact search over every stored vector (no index).
    #[default]
    Flat,
    /// An inverted file: vectors grouped by their nearest of `nlist` k-means centroids; a
    /// search scans the lists of the `nprobe` centroids nearest the query, exactly.
    IvfFlat {
        /// Lists (k-means centroids); at least 1, at most the vectors trained on.
        nlist: usize,
    },
    /// IVF-SQ8: an inverted file whose lists hold each vector's residual to its centroid as
    /// one byte per component (an 8-bit grid trained per component); a search ranks the
    /// probed lists' rows by their codes and re-ranks the best `refine_factor * k` exactly
    /// against the stored vectors.
    IvfSq8 {
        /// Lists (k-means centroids); at least 1, at most the vectors trained on.
        nlist: usize,
    },
    /// The flat SQ8 index: every vector as one byte per component (IVF-SQ8 over a single
    /// list), searched by its codes with an exact re-rank of the best `refine_factor * k`.
    Sq8,
    /// Binary quantization: every vector as one bit per component (on which side of the
    /// collection's mean it lies), ranked by Hamming distance as a first pass, then the best
    /// `refine_factor * k` re-ranked exactly. 32x smaller than f32 codes, and coarse: it
    /// needs a larger refine factor than SQ8 (its default is 16).
    Binary,
    /// IVF-PQ: an inverted file whose lists hold each vector's residual to its centroid as
    /// `m` codes of `bits` bits, one per sub-vector of `dim / m` components (each code names
    /// the nearest of `2^bits` centroids trained for that sub-space); a search ranks the
    /// probed lists' rows by asymmetric distances read from per-query lookup tables and
    /// re-ranks the best `refine_factor * k` exactly against the stored vectors.
    IvfPq {
        /// Lists (k-means centroids); at least 1, at most the vectors trained on.
        nlist: usize,
        /// Sub-quantizers; must divide the collection's dimension.
        m: usize,
        /// Bits per code: 4 or 8.
        bits: usize,
    },
    /// The flat PQ index: every vector as `m` product-quantizer codes of `bits` bits (IVF-PQ
    /// over a single list), searched by its codes with an exact re-rank.
    Pq {
        /// Sub-quantizers; must divide the collection's dimension.
        m: usize,
        /// Bits per code: 4 or 8.
        bits: usize,
    },
}

impl IndexSpec {
    /// The spec's kind as its string starts: `flat`, `ivf-flat`, `ivf-sq8`, `sq8`, `binary`,
    /// `ivf-pq`, `pq`.
    pub fn kind(&self) -> &'static str {
        match self {
            IndexSpec::Flat => "flat",
            IndexSpec::IvfFlat { .. } => "ivf-flat",
            IndexSpec::IvfSq8 { .. } => "ivf-sq8",
            IndexSpec::Sq8 => "sq8",
            IndexSpec::Binary => "binary",
            IndexSpec::IvfPq { .. } => "ivf-pq",
            IndexSpec::Pq { .. } => "pq",
        }
    }

    /// Inverted lists the index keeps (1 for the flat quantized indexes, 0 for `flat`).
    pub fn nlist(&self) -> usize {
        match *self {
            IndexSpec::Flat => 0,
            IndexSpec::IvfFlat { nlist } | IndexSpec::IvfSq8 { nlist } | IndexSpec::IvfPq { nlist, .. } => {
                nlist
            }
            IndexSpec::Sq8 | IndexSpec::Binary | IndexSpec::Pq { .. } => 1,
        }
    }

    /// A product-quantized index's sub-quantizers and bits per code.
    pub fn product_codes(&self) -> Option<(usize, usize)> {
        match *self {
            IndexSpec::IvfPq { m, bits, .. } | IndexSpec::Pq { m, bits } => Some((m, bits)),
            _ => None,
        }
    }

    /// Whether searches rank candidates by codes and re-rank the best `refine_factor * k`.
    pub fn is_quantized(&self) -> bool {
        !matches!(self, IndexSpec::Flat | IndexSpec::IvfFlat { .. })
    }

    /// The refine factor a search uses when it names none: [`crate::DEFAULT_REFINE_FACTOR`]
    /// for SQ8 codes, [`crate::DEFAULT_PQ_REFINE_FACTOR`] for PQ codes,
    /// [`crate::DEFAULT_BINARY_REFINE_FACTOR`] for binary ones (1 for an index that does not
    /// re-rank).
    pub fn default_refine_factor(&self) -> usize {
        match self {
            IndexSpec::IvfSq8 { .. } | IndexSpec::Sq8 => crate::DEFAULT_REFINE_FACTOR,
            IndexSpec::Binary => crate::DEFAULT_BINARY_REFINE_FACTOR,
            IndexSpec::IvfPq { .. } | IndexSpec::Pq { .. } => crate::DEFAULT_PQ_REFINE_FACTOR,
            IndexSpec::Flat | IndexSpec::IvfFlat { .. } => 1,
        }
    }
}

impl std::fmt::Display for IndexSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexSpec::Flat => write!(f, "flat"),
            IndexSpec::IvfFlat { nlist } => write!(f, "ivf-flat:nlist={nlist}"),
            IndexSpec::IvfSq8 { nlist } => write!(f, "ivf-sq8:nlist={nlist}"),
            IndexSpec::Sq8 => write!(f, "sq8"),
            IndexSpec::Binary => write!(f, "binary"),
            IndexSpec::IvfPq { nlist, m, bits } => write!(f, "ivf-pq:nlist={nlist},m={m},bits={bits}"),
            IndexSpec::Pq { m, bits } => write!(f, "pq:m={m},bits={bits}"),
        }
    }
}

impl std::str::FromStr for IndexSpec {
    type Err = HiveGpuError;

    fn from_str(text: &str) -> Result<Self> {
        let (kind, rest) = text.trim().split_once(':').unwrap_or((text.trim(), ""));
        let mut params = Params::parse(text, rest)?;
        let spec = match kind.trim().to_ascii_lowercase().as_str() {
            "flat" => IndexSpec::Flat,
            "ivf-flat" | "ivfflat" => IndexSpec::IvfFlat { nlist: params.take_count("nlist")? },
            "ivf-sq8" | "ivfsq8" => IndexSpec::IvfSq8 { nlist: params.take_count("nlist")? },
            "sq8" => IndexSpec::Sq8,
            "binary" => IndexSpec::Binary,
            "ivf-pq" | "ivfpq" => {
                let nlist = params.take_count("nlist")?;
                let (m, bits) = take_product_codes(&mut params)?;
                IndexSpec::IvfPq { nlist, m, bits }
            }
            "pq" => {
                let (m, bits) = take_product_codes(&mut params)?;
                IndexSpec::Pq { m, bits }
            }
            other => {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "index spec {text:?}: unknown index kind {other:?} (known: flat, ivf-flat:nlist=N, ivf-sq8:nlist=N, sq8, binary, ivf-pq:nlist=N,m=M[,bits=8|4], pq:m=M[,bits=8|4])"
                )));
            }
        };
        params.finish()?;
        Ok(spec)
    }
}

/// Bits per product-quantizer code when a spec names none (FAISS's and cuVS's default).
const DEFAULT_PQ_BITS: usize = 8;

/// A PQ spec's `m` (required) and `bits` (4 or 8, default 8).
fn take_product_codes(params: &mut Params<'_>) -> Result<(usize, usize)> {
    let m = params.take_count("m")?;
    let text = params.text;
    let bits = match params.take("bits") {
        Some(value) => parse_count(text, "bits", value)?,
        None => DEFAULT_PQ_BITS,
    };
    if !matches!(bits, 4 | 8) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{text:?}: bits must be 4 or 8 (a code indexes 16 or 256 sub-centroids), got {bits}"
        )));
    }
    Ok((m, bits))
}

/// `name=value` parameters of a spec, taken one by one; what is left over is an error.
pub(crate) struct Params<'a> {
    text: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    /// The comma-separated `name=value` pairs of `rest`, part of `text` (named in errors). A
    /// name given twice is an error.
    pub(crate) fn parse(text: &'a str, rest: &'a str) -> Result<Self> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').map(|(n, v)| (n.trim(), v.trim())).unwrap_or((part, ""));
            if pairs.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "{text:?}: parameter {name:?} given twice"
                )));
            }
            pairs.push((name, value));
        }
        Ok(Self { text, pairs })
    }

    /// The value of `name`, if given.
    pub(crate) fn take(&mut self, name: &str) -> Option<&'a str> {
        let at = self.pairs.iter().position(|(n, _)| n.eq_ignore_ascii_case(name))?;
        Some(self.pairs.remove(at).1)
    }

    /// The required whole number of at least 1 named `name`.
    pub(crate) fn take_count(&mut self, name: &str) -> Result<usize> {
        let text = self.text;
        match self.take(name) {
            Some(value) => parse_count(text, name, value),
            None => Err(HiveGpuError::InvalidArgument(format!("{text:?}: parameter {name}=N is required"))),
        }
    }

    /// Fails naming the first parameter nobody took.
    pub(crate) fn finish(self) -> Result<()> {
        match self.pairs.first() {
            Some((name, _)) => {
                Err(HiveGpuError::InvalidArgument(format!("{:?}: unknown parameter {name:?}", self.text)))
            }
            None => Ok(()),
        }
    }
}

/// `value` as a whole number of at least 1, or an error naming `name` in `text`.
pub(crate) fn parse_count(text: &str, name: &str, value: &str) -> Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(HiveGpuError::InvalidArgument(format!(
            "{text:?}: {name} must be a whole number of at least 1, got {value:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_their_strings() {
        for spec in [
            IndexSpec::Flat,
            IndexSpec::IvfFlat { nlist: 1 },
            IndexSpec::IvfFlat { nlist: 65536 },
            IndexSpec::IvfSq8 { nlist: 7 },
            IndexSpec::Sq8,
            IndexSpec::Binary,
            IndexSpec::IvfPq { nlist: 1024, m: 16, bits: 8 },
            IndexSpec::IvfPq { nlist: 3, m: 25, bits: 4 },
            IndexSpec::Pq { m: 8, bits: 4 },
        ] {
            assert_eq!(spec.to_string().parse::<IndexSpec>().unwrap(), spec);
        }
        assert_eq!(" IVF-Flat : NLIST = 8 ".parse::<IndexSpec>().unwrap(), IndexSpec::IvfFlat { nlist: 8 });
        assert_eq!(
            "ivf-pq:m=16,nlist=64".parse::<IndexSpec>().unwrap(),
            IndexSpec::IvfPq { nlist: 64, m: 16, bits: 8 }
        );
    }

    #[test]
    fn a_bad_spec_is_refused_naming_what_is_wrong() {
        for (text, needle) in [
            ("ivf-flat", "nlist=N is required"),
            ("ivf-flat:nlist=0", "at least 1"),
            ("ivf-flat:nlist=-3", "at least 1"),
            ("ivf-flat:nlist=12x", "\"12x\""),
            ("ivf-flat:nlist=8,nlist=9", "given twice"),
            ("ivf-flat:nlist=8,m=4", "unknown parameter \"m\""),
            ("flat:nlist=8", "unknown parameter \"nlist\""),
            ("sq8:nlist=8", "unknown parameter \"nlist\""),
            ("ivf-sq8", "nlist=N is required"),
            ("ivf-pq:nlist=8", "m=N is required"),
            ("ivf-pq:m=8", "nlist=N is required"),
            ("pq:m=8,bits=6", "bits must be 4 or 8"),
            ("pq:m=0", "at least 1"),
            ("pq:m=8,nlist=4", "unknown parameter \"nlist\""),
            ("hnsw:m=16", "unknown index kind"),
            ("", "unknown index kind"),
        ] {
            let e = text.parse::<IndexSpec>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
