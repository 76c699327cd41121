//! The parameter blocks of the WGSL kernels as `#[repr(C)]` structs, field for field the
//! uniform structs of `kernels/common.wgsl` (`Params`) and `kernels/filter.wgsl`
//! (`FilterParams`), and the per-query selection state the kernels leave for the host.
//!
//! A block used to be a positional array of 16 words, so a field moved on one side still
//! compiled. `declared_blocks_match_the_wgsl_structs` (a unit test that needs no GPU) reads
//! the WGSL structs and checks names, order and scalar types against these.

/// The scalar type of one field of a parameter block.
// Read by the layout check (tests) only.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scalar {
    /// `u32`.
    U32,
    /// `f32`.
    F32,
}

macro_rules! wgsl_block {
    ($(
        $(#[doc = $doc:literal])*
        struct $name:ident as $wgsl:literal {
            $($(#[doc = $fdoc:literal])* $field:ident: $kind:ident),+ $(,)?
        }
    )+) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
            pub(super) struct $name {
                $($(#[doc = $fdoc])* pub(super) $field: wgsl_block!(@type $kind),)+
            }

            impl $name {
                /// `(name, type)` of each field, in order.
                #[cfg(test)]
                pub(super) const FIELDS: &'static [(&'static str, Scalar)] =
                    &[$((stringify!($field), Scalar::$kind)),+];
                /// The name of the WGSL struct it mirrors.
                #[cfg(test)]
                pub(super) const WGSL_NAME: &'static str = $wgsl;
            }
        )+
    };
    (@type U32) => { u32 };
    (@type F32) => { f32 };
}

wgsl_block! {
    /// The parameters of the search and selection kernels (`Params` in `common.wgsl`).
    struct Params as "Params" {
        /// Rows in this dispatch (chunk rows for the search kernels, else all).
        n_rows: U32,
        /// First slot of the chunk.
        row_offset: U32,
        /// Components per row.
        dim: U32,
        /// Queries of the tile.
        nq: U32,
        /// [`crate::exact::metric_code`].
        metric: U32,
        /// Distances per query in `dist` (the collection's slot count).
        stride: U32,
        /// Radix pass: bit position of the digit.
        shift: U32,
        /// Candidates kept per query.
        cap: U32,
        /// Neighbours wanted (single-query lists; the threshold pass).
        k: U32,
        /// Index of the dispatch's first list.
        list_base: U32,
        /// Words per list: a count, then (key, slot) pairs.
        list_words: U32,
        /// Lists in all (the threshold pass: whether a sample ranked the queries).
        lists: U32,
        /// The query's error band, multiplier (see the host's bounds).
        gate_mul: F32,
        /// The query's error band, addend.
        gate_add: F32,
        /// Pairs a list holds.
        list_cap: U32,
        /// Padding to 16 words.
        pad: U32,
    }

    /// The parameters of the rounded-f16 filter (`FilterParams` in `filter.wgsl`).
    struct FilterParams as "FilterParams" {
        /// Rows this dispatch reads (sample rows in mode 0).
        n_rows: U32,
        /// Slot of the chunk's first row.
        first_slot: U32,
        /// Queries of the tile.
        nq: U32,
        /// [`crate::exact::metric_code`].
        metric: U32,
        /// 0: sample distances, 1: filter lists.
        mode: U32,
        /// Chunk rows from one row of the dispatch to the next.
        row_step: U32,
        /// Rows of the dispatch per workgroup along y.
        rows_per_split: U32,
        /// Mode 0: index of the chunk's first sample row; mode 1: first list word.
        out_base: U32,
        /// Words per query: the sample size, or a list's words (1 + 2 cap).
        out_stride: U32,
        /// Entries a list holds.
        cap: U32,
        /// The power of two f32 rows are scaled by before rounding to f16.
        x_scale: F32,
        /// 1 / (query scale * x_scale): scaled sums back to dot products.
        unscale: F32,
        /// Padding to 16 words.
        pad1: U32,
        /// Padding.
        pad2: U32,
        /// Padding.
        pad3: U32,
        /// Padding.
        pad4: U32,
    }
}

/// One query's radix-selection state in the `state` buffer, as the kernels of
/// `select.wgsl` leave it: the selected key's prefix and mask, the rank still to find, and the
/// candidates collected.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct SelectState {
    /// Bits of the selected key fixed so far.
    pub(super) prefix: u32,
    /// Which key bits the prefix fixes.
    pub(super) mask: u32,
    /// Rank still to find inside the prefix (the host starts it at k).
    pub(super) remaining: u32,
    /// Candidates collected (past the list's capacity when it overflowed).
    pub(super) count: u32,
}

impl SelectState {
    /// The state a query's selection starts from: nothing fixed, the `rank`-th key to find.
    pub(super) fn start(rank: usize) -> Self {
        Self { remaining: rank as u32, ..Self::default() }
    }
}

/// Parameter blocks laid out one per `stride` bytes (the uniform offset alignment) in one
/// buffer; each push returns the block's offset for `set_bind_group`.
#[derive(Debug, Default)]
pub(super) struct Blocks {
    bytes: Vec<u8>,
}

impl Blocks {
    /// Appends `block` at the next multiple of `stride` and returns its offset.
    pub(super) fn push<T: bytemuck::Pod>(&mut self, block: T, stride: u64) -> u32 {
        let offset = self.bytes.len() as u32;
        self.bytes.extend_from_slice(bytemuck::bytes_of(&block));
        self.bytes.resize(self.bytes.len().next_multiple_of(stride as usize), 0);
        offset
    }

    /// The buffer's contents.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, type)` of each member of WGSL struct `name` in `source`.
    fn wgsl_struct(source: &str, name: &str) -> Vec<(String, String)> {
        let start = source.find(&format!("struct {name} {{")).unwrap_or_else(|| panic!("no struct {name}"));
        let body = &source[start..];
        let body = &body[body.find('{').expect("a body") + 1..body.find('}').expect("a closed body")];
        body.lines()
            .map(|line| line.split("//").next().unwrap_or("").trim())
            .filter(|line| !line.is_empty())
            .map(|line| {
                let (field, ty) = line.trim_end_matches(',').split_once(':').expect("name: type");
                (field.trim().to_string(), ty.trim().to_string())
            })
            .collect()
    }

    fn declared(fields: &[(&str, Scalar)]) -> Vec<(String, String)> {
        let name = |s: Scalar| match s {
            Scalar::U32 => "u32",
            Scalar::F32 => "f32",
        };
        fields.iter().map(|(f, s)| (f.to_string(), name(*s).to_string())).collect()
    }

    #[test]
    fn declared_blocks_match_the_wgsl_structs() {
        let common = include_str!("kernels/common.wgsl");
        let filter = include_str!("kernels/filter.wgsl");
        assert_eq!(wgsl_struct(common, Params::WGSL_NAME), declared(Params::FIELDS));
        assert_eq!(wgsl_struct(filter, FilterParams::WGSL_NAME), declared(FilterParams::FIELDS));
        // Scalars only, 4 bytes each: the uniform layout is the declaration order.
        assert_eq!(std::mem::size_of::<Params>() as u64, super::super::rows::PARAMS_BYTES);
        assert_eq!(std::mem::size_of::<FilterParams>() as u64, super::super::rows::PARAMS_BYTES);
    }

    #[test]
    fn the_struct_reader_sees_a_moved_field() {
        let a = wgsl_struct("struct P {\n a: u32, // x\n b: f32,\n}", "P");
        let b = wgsl_struct("struct P {\n b: f32,\n a: u32,\n}", "P");
        assert_eq!(a, vec![("a".to_string(), "u32".to_string()), ("b".to_string(), "f32".to_string())]);
        assert_ne!(a, b);
    }

    #[test]
    fn blocks_sit_at_the_uniform_alignment() {
        let mut blocks = Blocks::default();
        assert_eq!(blocks.push(Params { k: 7, ..Params::default() }, 256), 0);
        assert_eq!(blocks.push(FilterParams::default(), 256), 256);
        assert_eq!(blocks.bytes().len(), 512);
        assert_eq!(&blocks.bytes()[32..36], &7u32.to_ne_bytes());
    }
}
