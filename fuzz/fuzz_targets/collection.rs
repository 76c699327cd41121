//! Fuzzes the collection file reader (`docs/FORMAT.md`): any input is refused with an error or
//! parsed into a description whose every part lies inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = hive_gpu::persist::inspect(data) {
        assert!(data.starts_with(b"HIVEGPUC"));
        assert_eq!(info.file_bytes, data.len() as u64);
        assert!(info.live <= info.slots);
        let element = if info.config.precision == hive_gpu::StoragePrecision::F16 { 2 } else { 4 };
        assert!((info.slots as u64) * (info.config.dimension as u64) * element <= data.len() as u64);
        for section in &info.sections {
            assert!(section.offset % 64 == 0 && section.offset + section.length <= data.len() as u64);
        }
    }
});
