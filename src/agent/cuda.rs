//! The CUDA backend: what only allocating can tell. The context overhead of a
//! new process (free memory before and after creating a context), the largest
//! block a job could allocate now (a bounded bisection with cuMemAlloc and
//! cuMemFree), and a touch-and-verify pass over a block with the kernels of
//! `kernels/touch.cu`, compiled at run time with NVRTC.
//!
//! libcuda and libnvrtc are loaded at run time through cudarc, whose loader
//! panics when a library or a symbol is absent: presence is checked first, and
//! every entry point also runs under `catch_unwind`, so an old driver gives an
//! error, not a crash.
//!
//! Every operation creates its own context and destroys it before returning,
//! so the agent holds no GPU memory between probes: destroying a context frees
//! whatever it still held, on top of each allocation being freed at once.
//! Never managed memory: only `cuMemAlloc`.

use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::driver::{result, sys};

use super::gpu::{BlockProbe, GpuError, MemoryCheck, SearchLimits, search_largest_block};

/// The kernels, embedded so the binary needs no file next to it.
pub const TOUCH_KERNELS: &str = include_str!("../../kernels/touch.cu");

const LIBCUDA: &str = "libcuda.so.1 (the CUDA driver library)";
const LIBNVRTC: &str = "libnvrtc.so (the CUDA run-time compiler)";
const WORD_BYTES: u64 = 8;
const THREADS_PER_BLOCK: u32 = 256;
const MAX_GRID: u32 = 8192;

/// The CUDA driver, initialised, with the UUID of every device it sees.
#[derive(Debug)]
pub struct Cuda {
    uuids: Vec<Option<String>>,
    ptx: OnceLock<Result<CString, GpuError>>,
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown failure".to_string())
}

/// Run `f`, turning a panic of cudarc's loader into an error.
fn guarded<T>(
    call: &str,
    device: Option<u32>,
    f: impl FnOnce() -> Result<T, GpuError>,
) -> Result<T, GpuError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(GpuError::call(
            call,
            device,
            format!("the CUDA library failed: {}", panic_message(p)),
        ))
    })
}

/// Launch `f` over `grid` blocks of [`THREADS_PER_BLOCK`] threads and wait for it;
/// `name` names the kernel in errors.
///
/// # Safety
/// `params` must point at live values of the kernel's argument types, in order, and the
/// memory they address must hold what the kernel touches.
unsafe fn run_kernel(
    f: sys::CUfunction,
    grid: u32,
    params: &mut [*mut c_void],
    name: &str,
    ordinal: i32,
) -> Result<(), GpuError> {
    // SAFETY: the caller vouches for `params`.
    unsafe {
        result::launch_kernel(
            f,
            (grid, 1, 1),
            (THREADS_PER_BLOCK, 1, 1),
            0,
            std::ptr::null_mut(),
            params,
        )
    }
    .map_err(|e| driver(&format!("cuLaunchKernel {name}"), ordinal, e))?;
    result::ctx::synchronize().map_err(|e| driver("cuCtxSynchronize", ordinal, e))
}

fn driver(call: &str, ordinal: i32, e: result::DriverError) -> GpuError {
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let call = if ordinal >= 0 {
        format!("{call} (CUDA device {ordinal})")
    } else {
        call.to_string()
    };
    GpuError::call(call, None, format!("{name}: {text}"))
}

fn is_oom(e: &result::DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML spells it.
pub fn uuid_string(bytes: &[u8; 16]) -> String {
    let h: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// A context of our own, current on this thread until dropped.
struct Context {
    ctx: sys::CUcontext,
}

impl Context {
    fn create(ordinal: i32) -> Result<Context, GpuError> {
        let dev = result::device::get(ordinal).map_err(|e| driver("cuDeviceGet", ordinal, e))?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `dev` comes from cuDeviceGet; cuCtxCreate fills `ctx` and
        // makes it current on this thread.
        unsafe { sys::cuCtxCreate_v2(&mut ctx, 0, dev) }
            .result()
            .map_err(|e| driver("cuCtxCreate", ordinal, e))?;
        Ok(Context { ctx })
    }

    fn make_current(&self, ordinal: i32) -> Result<(), GpuError> {
        // SAFETY: `ctx` is alive until drop.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| driver("cuCtxSetCurrent", ordinal, e))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by cuCtxCreate and destroyed once; this frees every
        // allocation the context still holds.
        let _ = unsafe { sys::cuCtxDestroy_v2(self.ctx) };
    }
}

/// Device memory freed on drop.
struct Block {
    ptr: sys::CUdeviceptr,
}

impl Block {
    fn alloc(bytes: u64, ordinal: i32) -> Result<Option<Block>, GpuError> {
        let n = usize::try_from(bytes).map_err(|_| {
            GpuError::call(
                "cuMemAlloc",
                None,
                format!("{bytes} bytes exceed the address space"),
            )
        })?;
        // SAFETY: plain device allocation in the current context; freed in drop.
        match unsafe { result::malloc_sync(n) } {
            Ok(ptr) => Ok(Some(Block { ptr })),
            Err(e) if is_oom(&e) => Ok(None),
            Err(e) => Err(driver("cuMemAlloc", ordinal, e)),
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in a context that is still alive
        // (blocks never outlive the `Context` of the same call).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A loaded module, unloaded on drop.
struct Module {
    module: sys::CUmodule,
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once, before its context is destroyed.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

fn current_free(ordinal: i32) -> Result<u64, GpuError> {
    let (free, _total) = result::mem_get_info().map_err(|e| driver("cuMemGetInfo", ordinal, e))?;
    Ok(free as u64)
}

impl Cuda {
    /// Load libcuda and initialise the driver.
    pub fn load() -> Result<Cuda, GpuError> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::LibraryMissing {
                library: LIBCUDA.to_string(),
                reason: "not found on the library search path; the NVIDIA container \
                         toolkit mounts it into GPU containers"
                    .to_string(),
            });
        }
        guarded("cuInit", None, || {
            result::init().map_err(|e| driver("cuInit", -1, e))?;
            let count =
                result::device::get_count().map_err(|e| driver("cuDeviceGetCount", -1, e))?;
            let uuids = (0..count)
                .map(|o| {
                    let dev = result::device::get(o).ok()?;
                    let id = result::device::get_uuid(dev).ok()?;
                    let bytes: [u8; 16] = id.bytes.map(|b| b as u8);
                    Some(uuid_string(&bytes))
                })
                .collect();
            Ok(Cuda {
                uuids,
                ptx: OnceLock::new(),
            })
        })
    }

    /// Devices the driver sees (CUDA_VISIBLE_DEVICES applies).
    pub fn device_count(&self) -> usize {
        self.uuids.len()
    }

    /// CUDA's ordinal for the device NVML calls `uuid` (the orders can differ).
    pub fn ordinal_of(&self, uuid: &str) -> Option<i32> {
        self.uuids
            .iter()
            .position(|u| u.as_deref() == Some(uuid))
            .and_then(|p| i32::try_from(p).ok())
    }

    /// Memory one new context takes. With `free_outside`, a reading of the
    /// device's free memory that needs no context (NVML), taken before and
    /// after creating ours; without, CUDA's own reading inside a first context,
    /// before and after creating a second one.
    pub fn context_overhead(
        &self,
        ordinal: i32,
        free_outside: Option<&dyn Fn() -> Result<u64, GpuError>>,
    ) -> Result<u64, GpuError> {
        guarded("context overhead", None, || match free_outside {
            Some(free) => {
                let before = free()?;
                let ctx = Context::create(ordinal)?;
                let after = free()?;
                drop(ctx);
                Ok(before.saturating_sub(after))
            }
            None => {
                let first = Context::create(ordinal)?;
                let before = current_free(ordinal)?;
                let second = Context::create(ordinal)?;
                let after = current_free(ordinal)?;
                drop(second);
                drop(first);
                Ok(before.saturating_sub(after))
            }
        })
    }

    /// The largest block a new process could allocate now, at most `max_bytes`
    /// and never more than CUDA says is free once our context exists.
    pub fn largest_block(
        &self,
        ordinal: i32,
        max_bytes: u64,
        limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError> {
        guarded("largest-block probe", None, || {
            let ctx = Context::create(ordinal)?;
            let free = current_free(ordinal)?;
            let probe = search_largest_block(max_bytes.min(free), limits, |bytes| {
                Ok(Block::alloc(bytes, ordinal)?.is_some())
            });
            drop(ctx);
            probe
        })
    }

    fn ptx(&self) -> Result<&CString, GpuError> {
        self.ptx
            .get_or_init(|| {
                // SAFETY: only tries to open the library.
                if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                    return Err(GpuError::LibraryMissing {
                        library: LIBNVRTC.to_string(),
                        reason: "not found on the library search path; memory verification \
                                 needs it"
                            .to_string(),
                    });
                }
                guarded("nvrtcCompileProgram", None, || {
                    let ptx = cudarc::nvrtc::compile_ptx(TOUCH_KERNELS).map_err(|e| {
                        GpuError::call(
                            "nvrtcCompileProgram",
                            None,
                            format!("kernels/touch.cu: {e}"),
                        )
                    })?;
                    CString::new(ptx.to_src()).map_err(|e| {
                        GpuError::call("nvrtcGetPTX", None, format!("NUL in the PTX: {e}"))
                    })
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Allocate `bytes` (at most what is free), write two complementary
    /// patterns and read each back, timing the passes.
    pub fn verify(&self, ordinal: i32, bytes: u64) -> Result<MemoryCheck, GpuError> {
        let ptx = self.ptx()?;
        guarded("memory verification", None, || {
            let ctx = Context::create(ordinal)?;
            ctx.make_current(ordinal)?;
            let words = bytes.min(current_free(ordinal)?) / WORD_BYTES;
            let bytes = words * WORD_BYTES;
            // SAFETY: `ptx` is NUL-terminated PTX text.
            let module = Module {
                module: unsafe { result::module::load_data(ptx.as_ptr().cast::<c_void>()) }
                    .map_err(|e| driver("cuModuleLoadData", ordinal, e))?,
            };
            let function = |name: &str| {
                let name = CString::new(name).expect("kernel names have no NUL");
                // SAFETY: the module is loaded.
                unsafe { result::module::get_function(module.module, name) }
                    .map_err(|e| driver("cuModuleGetFunction", ordinal, e))
            };
            let write = function("touch_write")?;
            let check = function("touch_verify")?;
            let Some(block) = Block::alloc(bytes, ordinal)? else {
                return Err(GpuError::call(
                    "cuMemAlloc",
                    None,
                    format!("{bytes} bytes for the memory check: out of memory"),
                ));
            };
            let Some(counters) = Block::alloc(2 * WORD_BYTES, ordinal)? else {
                return Err(GpuError::call(
                    "cuMemAlloc",
                    None,
                    "16 bytes: out of memory",
                ));
            };
            let grid = u32::try_from(words.div_ceil(u64::from(THREADS_PER_BLOCK)))
                .unwrap_or(MAX_GRID)
                .clamp(1, MAX_GRID);
            let mut report = MemoryCheck {
                bytes,
                mismatched_words: 0,
                first_bad_word: None,
                write_gb_per_s: None,
                read_gb_per_s: None,
            };
            let (mut write_secs, mut read_secs) = (0.0f64, 0.0f64);
            for seed in [0x5555_5555_5555_5555u64, 0xAAAA_AAAA_AAAA_AAAA] {
                let mut ptr = block.ptr;
                let mut n = words;
                let mut s = seed;
                let started = Instant::now();
                let mut params = [
                    (&mut ptr as *mut sys::CUdeviceptr).cast::<c_void>(),
                    (&mut n as *mut u64).cast::<c_void>(),
                    (&mut s as *mut u64).cast::<c_void>(),
                ];
                // SAFETY: arguments match touch_write(u64*, u64, u64); the block
                // holds `words` words.
                unsafe { run_kernel(write, grid, &mut params, "touch_write", ordinal) }?;
                write_secs += started.elapsed().as_secs_f64();

                let init = [0u64, u64::MAX];
                // SAFETY: `counters` holds two words.
                unsafe { result::memcpy_htod_sync(counters.ptr, &init) }
                    .map_err(|e| driver("cuMemcpyHtoD", ordinal, e))?;
                let mut cptr = counters.ptr;
                let started = Instant::now();
                let mut params = [
                    (&mut ptr as *mut sys::CUdeviceptr).cast::<c_void>(),
                    (&mut n as *mut u64).cast::<c_void>(),
                    (&mut s as *mut u64).cast::<c_void>(),
                    (&mut cptr as *mut sys::CUdeviceptr).cast::<c_void>(),
                ];
                // SAFETY: arguments match touch_verify(u64*, u64, u64, u64*).
                unsafe { run_kernel(check, grid, &mut params, "touch_verify", ordinal) }?;
                read_secs += started.elapsed().as_secs_f64();
                let mut out = [0u64; 2];
                // SAFETY: `counters` holds two words.
                unsafe { result::memcpy_dtoh_sync(&mut out, counters.ptr) }
                    .map_err(|e| driver("cuMemcpyDtoH", ordinal, e))?;
                report.mismatched_words += out[0];
                if out[0] > 0 {
                    report.first_bad_word =
                        Some(report.first_bad_word.map_or(out[1], |f| f.min(out[1])));
                }
            }
            let gb = 2.0 * bytes as f64 / 1e9;
            if write_secs > 0.0 {
                report.write_gb_per_s = Some(gb / write_secs);
            }
            if read_secs > 0.0 {
                report.read_gb_per_s = Some(gb / read_secs);
            }
            drop(counters);
            drop(block);
            drop(module);
            drop(ctx);
            Ok(report)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gpu::SearchLimits;
    use std::time::Duration;

    #[test]
    fn uuid_format_matches_nvml() {
        let b: [u8; 16] = [
            0x8b, 0x0a, 0x1c, 0x2d, 0x3e, 0x4f, 0x50, 0x61, 0x72, 0x83, 0x94, 0xa5, 0xb6, 0xc7,
            0xd8, 0xe9,
        ];
        assert_eq!(uuid_string(&b), "GPU-8b0a1c2d-3e4f-5061-7283-94a5b6c7d8e9");
    }

    #[test]
    fn kernels_are_embedded() {
        assert!(TOUCH_KERNELS.contains("touch_write"));
        assert!(TOUCH_KERNELS.contains("touch_verify"));
    }

    #[test]
    fn without_libcuda_load_is_an_error_not_a_panic() {
        // SAFETY: only tries to open the library.
        if unsafe { sys::is_culib_present() } {
            return; // a GPU machine: the #[ignore]d tests below cover it
        }
        let e = Cuda::load().unwrap_err();
        assert!(e.to_string().contains("libcuda"), "{e}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn context_overhead_is_measured() {
        let cuda = Cuda::load().expect("a GPU machine");
        let overhead = cuda.context_overhead(0, None).expect("measured");
        assert!(overhead > 16 << 20, "{overhead}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn largest_block_on_an_idle_gpu_is_close_to_free() {
        let cuda = Cuda::load().expect("a GPU machine");
        let p = cuda
            .largest_block(0, u64::MAX, SearchLimits::within(Duration::from_secs(5)))
            .expect("probed");
        assert!(p.exact && p.bytes > 0, "{p:?}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn kernels_verify_memory() {
        let cuda = Cuda::load().expect("a GPU machine");
        let check = cuda.verify(0, 256 << 20).expect("verified");
        assert_eq!(check.mismatched_words, 0, "{check:?}");
        assert!(check.write_gb_per_s.is_some_and(|g| g > 1.0), "{check:?}");
    }
}
