#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| batchwire::core::fuzz::frames(data));
