/*
 * A stand-in libnvidia-ml.so.1 for tests: the real NVML backend's code runs
 * against it on machines without a GPU. tests/agent.rs compiles it with
 * `cc -shared -fPIC` into a temporary directory, once per variant:
 *
 *   (none)          two "NVIDIA H100 80GB HBM3", v2 memory info, one process on GPU 0
 *   -DNO_MEMORY_V2  no nvmlDeviceGetMemoryInfo_v2: the backend falls back to v1
 *   -DNO_UUID       no nvmlDeviceGetUUID: optional data, the GPU is still read
 *   -DNO_MEMORY     no memory query at all: reading a GPU is an error
 *   -DNO_COUNT      no nvmlDeviceGetCount_v2: counting GPUs is an error
 *   -DLOST_GPU=1    GPU 1 answers NVML_ERROR_GPU_IS_LOST to the memory query
 *   -DINIT_FAILS    nvmlInit_v2 answers NVML_ERROR_DRIVER_NOT_LOADED
 *
 * Functions it lacks (architecture, MIG, ECC, events, ...) make the wrapper
 * report FailedToLoadSymbol, which the backend must turn into "not read".
 */
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15

#define DEVICES 2
#define MIB (1024ULL * 1024ULL)
#define TOTAL (81559ULL * MIB)
#define RESERVED (453ULL * MIB)

struct stub_device {
    unsigned int index;
};
typedef struct stub_device *nvmlDevice_t;
static struct stub_device devices[DEVICES] = {{0}, {1}};

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static unsigned long long used_of(unsigned int i) {
    /* GPU 0 runs a process holding 1 GiB; GPU 1 is idle. */
    return i == 0 ? 1024ULL * MIB : 0;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int len) {
    if (out == 0 || strlen(s) + 1 > len) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(out, s);
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) {
    return d == &devices[0] || d == &devices[1];
}

nvmlReturn_t nvmlInit_v2(void) {
#ifdef INIT_FAILS
    return NVML_ERROR_DRIVER_NOT_LOADED;
#else
    return NVML_SUCCESS;
#endif
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    return copy_string("570.124.06", version, len);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    *version = 12080;
    return NVML_SUCCESS;
}

#ifndef NO_COUNT
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = DEVICES;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= DEVICES) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string("NVIDIA H100 80GB HBM3", name, len);
}

#ifndef NO_UUID
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_string(d->index == 0 ? "GPU-00000000-1111-2222-3333-000000000000"
                                     : "GPU-00000000-1111-2222-3333-000000000001",
                       uuid, len);
}
#endif

#ifndef NO_MEMORY
static nvmlReturn_t lost(nvmlDevice_t d) {
#ifdef LOST_GPU
    if (d->index == LOST_GPU) return NVML_ERROR_GPU_IS_LOST;
#endif
    (void)d;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost(d) != NVML_SUCCESS) return lost(d);
    /* v1: the driver's reserve is counted as used. */
    m->total = TOTAL;
    m->used = RESERVED + used_of(d->index);
    m->free = TOTAL - m->used;
    return NVML_SUCCESS;
}

#ifndef NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24))) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (lost(d) != NVML_SUCCESS) return lost(d);
    m->total = TOTAL;
    m->reserved = RESERVED;
    m->used = used_of(d->index);
    m->free = TOTAL - RESERVED - m->used;
    return NVML_SUCCESS;
}
#endif
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = d->index == 0 ? 1 : 0;
    if (infos == 0 || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n == 1) {
        infos[0].pid = 4242;
        infos[0].usedGpuMemory = used_of(0);
        infos[0].gpuInstanceId = 0xFFFFFFFFu;
        infos[0].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}
