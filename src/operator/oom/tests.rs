//! The recognisers against the messages as the frameworks print them.

use super::parse::strip_prefix;
use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// `2.00 GiB` etc. as the messages print them, to the byte.
fn gib(hundredths: u64) -> u64 {
    hundredths * GIB / 100
}
fn mib(hundredths: u64) -> u64 {
    hundredths * MIB / 100
}

const TORCH_NEW: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

const TORCH_OLD: &str = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

#[test]
fn pytorch_todays_format() {
    let o = parse(TORCH_NEW).unwrap();
    assert_eq!(o.framework, Framework::PyTorch);
    assert_eq!(o.rank, None);
    assert_eq!(o.gpu, Some(0));
    assert_eq!(o.tried_bytes, Some(2 * GIB));
    assert_eq!(o.total_bytes, Some(gib(7915)));
    assert_eq!(o.free_bytes, Some(gib(102)));
    assert_eq!(o.process_in_use_bytes, Some(gib(7812)));
    assert_eq!(o.allocated_by_framework_bytes, Some(gib(7550)));
    assert_eq!(o.reserved_by_framework_bytes, Some(gib(7550) + gib(110)));
    assert_eq!(o.reserved_unallocated_bytes(), Some(gib(110)));
    assert_eq!(missing_bytes(&o), Some(2 * GIB - gib(102)));
    assert_eq!(need_floor_bytes(&o), Some(gib(7812) + 2 * GIB));
}

#[test]
fn pytorch_older_format() {
    let o = parse(TORCH_OLD).unwrap();
    assert_eq!(o.framework, Framework::PyTorch);
    assert_eq!(o.gpu, Some(0));
    assert_eq!(o.tried_bytes, Some(20 * MIB));
    assert_eq!(o.total_bytes, Some(gib(1076)));
    assert_eq!(o.allocated_by_framework_bytes, Some(gib(961)));
    assert_eq!(o.free_bytes, Some(mib(869)));
    assert_eq!(o.reserved_by_framework_bytes, Some(gib(967)));
    assert_eq!(o.process_in_use_bytes, None);
    assert_eq!(missing_bytes(&o), Some(20 * MIB - mib(869)));
    // No whole-process figure: the floor is what PyTorch reserved plus the request.
    assert_eq!(need_floor_bytes(&o), Some(gib(967) + 20 * MIB));
}

#[test]
fn pytorch_1_x_cached_and_2_0_module_name() {
    let o = parse("RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 1; 11.17 GiB total capacity; 10.62 GiB already allocated; 832.00 KiB free; 10.66 GiB cached)").unwrap();
    assert_eq!(o.gpu, Some(1));
    assert_eq!(o.free_bytes, Some(832 * 1024));
    assert_eq!(o.reserved_by_framework_bytes, Some(gib(1066)));
    let o = parse("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 3; 79.15 GiB total capacity; 75.04 GiB already allocated; 1.01 GiB free; 77.22 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.").unwrap();
    assert_eq!(o.gpu, Some(3));
    assert_eq!(o.tried_bytes, Some(gib(153)));
    assert_eq!(o.reserved_by_framework_bytes, Some(gib(7722)));
}

#[test]
fn torchrun_rank_prefixes_and_a_traceback_after() {
    let log = "\
[rank3]: Traceback (most recent call last):
[rank3]:   File \"/workspace/train.py\", line 212, in <module>
[rank3]:     loss.backward()
[rank3]:   File \"/usr/local/lib/python3.11/site-packages/torch/_tensor.py\", line 626, in backward
[rank3]:     torch.autograd.backward(
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
W0501 12:00:03.123000 140 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 141 closing signal SIGTERM
E0501 12:00:04.456000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 144) of binary: /usr/bin/python
Traceback (most recent call last):
  File \"/usr/local/bin/torchrun\", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
";
    let o = parse(log).unwrap();
    assert_eq!(o.rank, Some(3));
    assert_eq!(o.gpu, Some(3));
    assert_eq!(o.tried_bytes, Some(2 * GIB));
    assert_eq!(o.process_in_use_bytes, Some(gib(7812)));

    let tee = "\
[default0]:Traceback (most recent call last):
[default0]:  File \"train.py\", line 80, in <module>
[default0]:RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch)
[default1]:RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 10.76 GiB total capacity; 9.50 GiB already allocated; 100.00 MiB free; 9.60 GiB reserved in total by PyTorch)
";
    let o = parse(tee).unwrap();
    assert_eq!(o.rank, Some(0), "the earliest of equally detailed reports");
    assert_eq!(o.gpu, Some(0));
    assert_eq!(o.allocated_by_framework_bytes, Some(gib(961)));
}

#[test]
fn kubectl_timestamps_are_stripped() {
    let line = format!("2025-05-01T12:00:00.123456789Z [rank12]: {TORCH_NEW}");
    let o = parse(&line).unwrap();
    assert_eq!(o.rank, Some(12));
    assert_eq!(o.tried_bytes, Some(2 * GIB));
}

#[test]
fn the_most_detailed_rank_report_wins() {
    let log = "\
[rank1]: RuntimeError: CUDA error: out of memory
[rank1]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 39.39 GiB of which 100.00 MiB is free.
";
    let o = parse(log).unwrap();
    assert_eq!(o.rank, Some(0));
    assert_eq!(o.tried_bytes, Some(512 * MIB));
    assert_eq!(o.total_bytes, Some(gib(3939)));
    assert_eq!(o.free_bytes, Some(100 * MIB));
    assert_eq!(o.process_in_use_bytes, None);
    // Nothing held is known: no floor, but the missing part is.
    assert_eq!(need_floor_bytes(&o), None);
    assert_eq!(missing_bytes(&o), Some(412 * MIB));
    // Alone, the bare CUDA error is still a PyTorch GPU OOM without numbers.
    let bare = parse("[rank1]: RuntimeError: CUDA error: out of memory").unwrap();
    assert_eq!(bare.framework, Framework::PyTorch);
    assert_eq!(bare.rank, Some(1));
    assert_eq!(missing_bytes(&bare), None);
}

#[test]
fn tensorflow_oom_when_allocating_tensor() {
    let log = "\
2025-05-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc) ran out of memory trying to allocate 4.00GiB (rounded to 4294967296)requested by op MatMul
If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation.
2025-05-01 12:00:00.000100: I tensorflow/core/common_runtime/bfc_allocator.cc:1101] Stats:
Limit:                     14328594432
InUse:                     12884901888
MaxInUse:                  13958643712
NumAllocs:                        1234
2025-05-01 12:00:00.000200: W tensorflow/core/framework/op_kernel.cc:1828] OP_REQUIRES failed at matmul_op_impl.h:728 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[32768,32768] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
Traceback (most recent call last):
tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__MatMul_device_/job:localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[32768,32768] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]
";
    let o = parse(log).unwrap();
    assert_eq!(o.framework, Framework::TensorFlow);
    assert_eq!(o.gpu, Some(0));
    assert_eq!(o.tried_bytes, Some(4 * GIB));
    assert_eq!(o.total_bytes, Some(14_328_594_432));
    assert_eq!(o.allocated_by_framework_bytes, Some(12_884_901_888));
    assert_eq!(missing_bytes(&o), Some(4 * GIB));
    assert_eq!(need_floor_bytes(&o), Some(12_884_901_888 + 4 * GIB));

    // The error alone: the tensor's size from its shape and type.
    let o = parse("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[64,1024,1024] and type half on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc").unwrap();
    assert_eq!(o.gpu, Some(1));
    assert_eq!(o.tried_bytes, Some(64 * 1024 * 1024 * 2));
}

#[test]
fn tensorflow_non_fatal_warning_is_not_an_oom() {
    let log = "\
2025-05-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:290] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.
Epoch 1/10
1875/1875 [==============================] - 12s 6ms/step - loss: 0.2941
Traceback (most recent call last):
ValueError: Input 0 of layer \"dense\" is incompatible with the layer";
    assert_eq!(parse(log), None);
    assert!(matches!(
        classify(Some("Error"), Some(1), log),
        Failure::Other { .. }
    ));
}

#[test]
fn jax_resource_exhausted() {
    let log = "\
Traceback (most recent call last):
  File \"/app/train.py\", line 51, in <module>
jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.
--------------------
For simplicity, JAX has removed its internal frames from the traceback of the following exception.";
    let o = parse(log).unwrap();
    assert_eq!(o.framework, Framework::Jax);
    assert_eq!(o.tried_bytes, Some(16 * GIB));
    assert_eq!(missing_bytes(&o), Some(16 * GIB));

    let o = parse("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB (1073741824B) on device ordinal 2").unwrap();
    assert_eq!(o.framework, Framework::Jax);
    assert_eq!(o.gpu, Some(2));
    assert_eq!(o.tried_bytes, Some(GIB));

    let o = parse("2025-05-01 12:00:00.000000: W external/xla/xla/tsl/framework/bfc_allocator.cc:497] Allocator (GPU_0_bfc) ran out of memory trying to allocate 26.50GiB (rounded to 28454158336)requested by op").unwrap();
    assert_eq!(o.framework, Framework::Jax);
    assert_eq!(o.tried_bytes, Some(28_454_158_336));
}

#[test]
fn nccl_and_cublas_allocation_failures() {
    let o =
        parse("gpu-node-3:412:1290 [2] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'")
            .unwrap();
    assert_eq!(o.framework, Framework::Nccl);
    assert_eq!(missing_bytes(&o), None);
    let o = parse("gpu-node-3:412:1290 [2] NCCL INFO ...\ngpu-node-3:412:1290 [2] transport/p2p.cc:204 NCCL WARN Cuda failure 2 'out of memory'").unwrap();
    assert_eq!(o.framework, Framework::Nccl);
    let log = "\
[rank5]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank5]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank5]: Last error:
[rank5]: Cuda failure 'out of memory'";
    let o = parse(log).unwrap();
    assert_eq!(o.framework, Framework::Nccl);
    assert_eq!(o.rank, Some(5));
    // Any other CUDA failure through NCCL is not a GPU OOM.
    assert_eq!(
        parse(
            "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'invalid device ordinal'"
        ),
        None
    );

    let o = parse(
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    )
    .unwrap();
    assert_eq!(o.framework, Framework::Cublas);
    let o = parse("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED").unwrap();
    assert_eq!(o.framework, Framework::Cudnn);
    let o = parse("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to create cuda context: CUDA_ERROR_OUT_OF_MEMORY: out of memory").unwrap();
    assert_eq!(o.framework, Framework::Cuda);
}

#[test]
fn classification() {
    // The kernel killed it: host memory, whatever the log says.
    assert_eq!(
        classify(Some("OOMKilled"), Some(137), TORCH_NEW),
        Failure::HostOom {
            exit_code: Some(137)
        }
    );
    assert_eq!(
        classify(Some("Error"), Some(137), "Killed"),
        Failure::HostOom {
            exit_code: Some(137)
        }
    );
    // Kubelet reports a CUDA OOM as a plain error.
    match classify(Some("Error"), Some(1), TORCH_OLD) {
        Failure::GpuOom(o) => assert_eq!(o.tried_bytes, Some(20 * MIB)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        classify(Some("Error"), Some(2), "ValueError: bad config"),
        Failure::Other {
            reason: Some("Error".into()),
            exit_code: Some(2)
        }
    );
    assert_eq!(
        classify(None, None, ""),
        Failure::Other {
            reason: None,
            exit_code: None
        }
    );
    let host = classify(Some("OOMKilled"), Some(137), "").message();
    assert!(host.contains("host RAM"), "{host}");
    let gpu = classify(None, Some(1), TORCH_NEW).message();
    assert!(gpu.contains("tried to allocate 2.00 GiB"), "{gpu}");
}

#[test]
fn sizes_and_units() {
    assert_eq!(size("2.00 GiB").map(|s| s.0), Some(2 * GIB));
    assert_eq!(size("4.00GiB (rounded").map(|s| s.0), Some(4 * GIB));
    assert_eq!(size("512 bytes").map(|s| s.0), Some(512));
    assert_eq!(size("1073741824B)").map(|s| s.0), Some(GIB));
    assert_eq!(size("832.00 KiB").map(|s| s.0), Some(832 * 1024));
    assert_eq!(size("1.5 TiB").map(|s| s.0), Some(3 << 39));
    assert_eq!(size("1.5 GB").map(|s| s.0), Some(1_500_000_000));
    assert_eq!(size("20 MB").map(|s| s.0), Some(20_000_000));
    assert_eq!(size("3 KB").map(|s| s.0), Some(3_000));
    assert_eq!(size("0.123456789123 GiB").map(|s| s.0), Some(132_560_717));
    assert_eq!(size("GiB"), None);
    assert_eq!(size("12 parsecs"), None);
    // Too big for u64: left out, not wrapped.
    assert_eq!(size("99999999999999999999 TiB"), None);
    assert_eq!(size("999999999999999999999999999999999999999999 B"), None);
    assert_eq!(
        parse("CUDA out of memory. Tried to allocate 99999999999 TiB.").map(|o| o.tried_bytes),
        Some(None)
    );
    assert_eq!(human(2 * GIB), "2.00 GiB");
    assert_eq!(human(512), "512 B");
    assert_eq!(human(u64::MAX), "16777216.00 TiB");
}

#[test]
fn shapes_that_overflow_are_left_out() {
    let o = parse("OOM when allocating tensor with shape[4294967296,4294967296,4294967296] and type float on /device:GPU:0 by allocator GPU_0_bfc").unwrap();
    assert_eq!(o.tried_bytes, None);
    let huge = GpuOom {
        tried_bytes: Some(u64::MAX),
        process_in_use_bytes: Some(1),
        ..GpuOom::new(Framework::PyTorch)
    };
    assert_eq!(need_floor_bytes(&huge), None);
    assert_eq!(missing_bytes(&huge), Some(u64::MAX));
}

#[test]
fn odd_prefixes_do_not_confuse_the_rank() {
    assert_eq!(strip_prefix("[rank99999999999]: x"), (None, " x"));
    assert_eq!(strip_prefix("[rank]: x"), (None, "[rank]: x"));
    assert_eq!(strip_prefix("[0]: x"), (None, "[0]: x"));
    assert_eq!(strip_prefix("[trainer_2]: x").0, Some(2));
    assert_eq!(strip_prefix("[trainer2]:x"), (Some(2), "x"));
    assert_eq!(strip_prefix("["), (None, "["));
    assert_eq!(strip_prefix("[é1]: x"), (None, "[é1]: x"));
}

proptest::proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC*") {
        let _ = parse(&s);
        let _ = classify(Some(&s), Some(1), &s);
        let _ = size(&s);
    }

    #[test]
    fn oom_shaped_text_never_panics(
        prefix in "(\\[rank[0-9]{0,12}\\]:|\\[default[0-9]\\]:|)",
        a in "[0-9]{0,25}(\\.[0-9]{0,15})?",
        b in "[0-9]{0,25}(\\.[0-9]{0,15})?",
        unit in "(B|KiB|MiB|GiB|TiB|KB|MB|GB|bytes|)",
        tail in "\\PC{0,40}",
    ) {
        let texts = [
            format!("{prefix} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {a} {unit}. GPU {b} has a total capacity of {b} {unit} of which {a} {unit} is free. Including non-PyTorch memory, this process has {a}{unit} memory in use. Of the allocated memory {b} {unit} is allocated by PyTorch, and {a} {unit} is reserved by PyTorch but unallocated.{tail}"),
            format!("{prefix}RuntimeError: CUDA out of memory. Tried to allocate {a} {unit} (GPU {b}; {a} {unit} total capacity; {b} {unit} already allocated; {a}{unit} free; {b} {unit} reserved in total by PyTorch{tail}"),
            format!("{prefix}Allocator (GPU_{b}_bfc) ran out of memory trying to allocate {a}{unit} (rounded to {b})\nLimit: {a}\nInUse: {b}{tail}"),
            format!("OOM when allocating tensor with shape[{a},{b}] and type float{tail}"),
            format!("RESOURCE_EXHAUSTED: Failed to allocate request for {a}{unit} ({b}{unit}{tail}"),
        ];
        for t in &texts {
            if let Some(o) = parse(t) {
                let _ = missing_bytes(&o);
                let _ = need_floor_bytes(&o);
                let _ = o.reserved_unallocated_bytes();
                let _ = o.to_string();
            }
        }
    }
}
