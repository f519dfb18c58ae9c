#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramguard_fuzz::inventory(data));
