#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| batchwire_core::fuzz::peer(data));
