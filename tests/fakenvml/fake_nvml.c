/*
 * A fake libnvidia-ml.so.1 for testing the real NVML code path (pynvml over ctypes) without a GPU.
 *
 * It exports the NVML entry points dradriver's discovery calls, with the C signatures and
 * struct layouts of nvml.h, and serves GPUs described by a tab-separated text file named by the
 * environment variable FAKE_NVML_CONFIG, else `fake-nvml.conf` next to the library itself (so that
 * a process whose environment the test does not control, e.g. serve in a DaemonSet pod, loads a
 * fake driver root laid out with it). The file is read by nvmlInitWithFlags when the reference
 * count goes from 0 to 1, and again by any later nvmlInitWithFlags once the file has changed (as
 * real NVML sees MIG devices created or destroyed by others, and a test can add or remove GPUs
 * under a running process); the health state of GPUs that stay (by UUID) is kept. Line formats (fields separated by one TAB):
 *
 *   driver   VERSION
 *   cuda     INT                      e.g. 12080 for CUDA 12.8
 *   gpu      MINOR UUID NAME BRAND ARCH CC_MAJOR CC_MINOR MEMORY_BYTES BUS_ID NUMA MIG_MODE
 *            NUMA -1: not reported; MIG_MODE -1: not MIG-capable, 0: disabled, 1: enabled
 *   profile  GPU INDEX ID SLICES INSTANCES SM CE DEC ENC JPEG OFA MEMORY_MB NAME PLACEMENT_SIZE STARTS
 *            STARTS is a comma-separated list of placement starts
 *   mig      GPU UUID GI CI GI_PROFILE_ID GI_START GI_SIZE CI_START CI_SIZE GI_SLICES CI_SLICES
 *            SM CE DEC ENC JPEG OFA MEMORY_MB
 *   fail     FUNCTION GPU CODE        FUNCTION returns CODE for GPU (its position, or * for all)
 *
 * GPU is the position of the gpu line (the NVML index).
 *
 * Health events: the environment variable FAKE_NVML_EVENTS names a FIFO that nvmlEventSetCreate
 * opens; nvmlEventSetWait_v2 blocks on it (poll, with the caller's timeout) and turns each line
 * written to it into what real NVML would report. Commands (fields separated by spaces):
 *
 *   xid GPU CODE [GI CI]     an XID critical-error event (GI/CI default 0xFFFFFFFF: the whole GPU),
 *                            delivered only if the GPU registered for XID events
 *   lost GPU                 the GPU falls off the bus: the wait returns NVML_ERROR_GPU_IS_LOST and
 *                            every later call on the GPU fails with it
 *   found GPU                the GPU answers again (no event)
 *   temp GPU CELSIUS         its temperature from now on (no event; default 40)
 *   ecc GPU COUNT            its volatile uncorrected ECC error count (no event; default 0)
 *   remap GPU PENDING FAIL   its row-remapping state (no event; default 0 0)
 *   mig GPU                  a MIG config change event (nvmlEventMigConfigChange), delivered only if
 *                            the GPU registered for it; rewrite the config file first
 *
 * nvmlInit/nvmlShutdown are reference-counted as in real NVML; the config is read when the count
 * goes from 0 to 1. Build:
 *   cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define EVENT_TYPE_SINGLE_BIT_ECC 0x1ULL
#define EVENT_TYPE_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_TYPE_XID 0x8ULL
#define EVENT_TYPE_MIG_CONFIG_CHANGE 0x100ULL
#define WHOLE_GPU 0xFFFFFFFFu
/* What a line on the events FIFO produced when it is not an event. */
#define NO_EVENT (-1)

#define MAX_GPUS 64
#define MAX_PROFILES 256
#define MAX_MIGS 512
#define MAX_FAILS 64
#define MAX_PLACEMENTS 16

enum kind { KIND_GPU = 0x47505521, KIND_MIG, KIND_GI, KIND_CI, KIND_EVENT_SET };

struct tag {
    int kind;
    int index;
};

struct gpu {
    struct tag tag;
    unsigned minor, brand, arch;
    int cc_major, cc_minor, numa, mig_mode;
    unsigned long long memory;
    char uuid[96], name[96], bus_id[32];
    /* Health state, changed through the events FIFO. */
    int lost;
    unsigned temperature, remap_pending, remap_failure;
    unsigned long long ecc_uncorrected, registered_events;
};

struct profile {
    int gpu;
    unsigned index, id, slices, instances, sm, ce, dec, enc, jpeg, ofa, placement_size, nstarts;
    unsigned long long memory_mb;
    unsigned starts[MAX_PLACEMENTS];
    char name[96];
};

struct mig {
    struct tag tag, gi_tag, ci_tag;
    int gpu;
    unsigned gi, ci, gi_profile_id, gi_start, gi_size, ci_start, ci_size, gi_slices, ci_slices;
    unsigned sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mb;
    char uuid[96];
};

struct fail {
    char function[64];
    int gpu; /* -1: every GPU */
    nvmlReturn_t code;
};

/* The one event set this fake supports, reading commands from the FIFO named by FAKE_NVML_EVENTS. */
static struct event_set {
    struct tag tag;
    int open, fd, writer_fd;
    size_t len;
    char buf[4096];
} event_set = {.fd = -1, .writer_fd = -1};

static struct {
    int initialized; /* nvmlInit reference count */
    char driver[80];
    int cuda;
    int ngpus, nprofiles, nmigs, nfails;
    struct gpu gpus[MAX_GPUS];
    struct profile profiles[MAX_PROFILES];
    struct mig migs[MAX_MIGS];
    struct fail fails[MAX_FAILS];
} state;

/* NVML's structs, laid out as in nvml.h (and pynvml's ctypes mirrors). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
typedef struct { unsigned start, size; } nvmlPlacement_t;
typedef struct {
    void *device;
    unsigned id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    void *device, *gpuInstance;
    unsigned id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static void copy_field(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

static int split_tabs(char *line, char **fields, int max) {
    int n = 0;
    char *save = NULL;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *tok = strtok_r(line, "\t", &save); tok && n < max; tok = strtok_r(NULL, "\t", &save))
        fields[n++] = tok;
    return n;
}

static unsigned u(const char *text) { return (unsigned)strtoul(text, NULL, 10); }

/* FAKE_NVML_CONFIG, else fake-nvml.conf in the directory this library was loaded from. */
static const char *config_path(void) {
    static char beside[4096];
    const char *path = getenv("FAKE_NVML_CONFIG");
    Dl_info self;
    if (!path && dladdr((void *)config_path, &self) && self.dli_fname) {
        const char *slash = strrchr(self.dli_fname, '/');
        int dir = slash ? (int)(slash - self.dli_fname) : 1;
        snprintf(beside, sizeof beside, "%.*s/fake-nvml.conf", dir, slash ? self.dli_fname : ".");
        path = beside;
    }
    return path;
}

/* The config file as last read: inode, modification time and size. */
static struct stat config_seen;

static int config_changed(void) {
    struct stat now;
    const char *path = config_path();
    if (!path || stat(path, &now) != 0)
        return 0;
    return now.st_ino != config_seen.st_ino || now.st_size != config_seen.st_size ||
           now.st_mtim.tv_sec != config_seen.st_mtim.tv_sec || now.st_mtim.tv_nsec != config_seen.st_mtim.tv_nsec;
}

static nvmlReturn_t load_config(void) {
    const char *path = config_path();
    FILE *file = path ? fopen(path, "r") : NULL;
    char line[1024], *f[24];
    memset(&state, 0, sizeof state);
    if (!file)
        return NVML_ERROR_UNKNOWN;
    fstat(fileno(file), &config_seen);
    while (fgets(line, sizeof line, file)) {
        int n = split_tabs(line, f, 24);
        if (n == 2 && !strcmp(f[0], "driver")) {
            copy_field(state.driver, sizeof state.driver, f[1]);
        } else if (n == 2 && !strcmp(f[0], "cuda")) {
            state.cuda = atoi(f[1]);
        } else if (n == 12 && !strcmp(f[0], "gpu") && state.ngpus < MAX_GPUS) {
            struct gpu *g = &state.gpus[state.ngpus];
            g->tag = (struct tag){KIND_GPU, state.ngpus++};
            g->minor = u(f[1]);
            copy_field(g->uuid, sizeof g->uuid, f[2]);
            copy_field(g->name, sizeof g->name, f[3]);
            g->brand = u(f[4]);
            g->arch = u(f[5]);
            g->cc_major = atoi(f[6]);
            g->cc_minor = atoi(f[7]);
            g->memory = strtoull(f[8], NULL, 10);
            copy_field(g->bus_id, sizeof g->bus_id, f[9]);
            g->numa = atoi(f[10]);
            g->mig_mode = atoi(f[11]);
            g->temperature = 40;
        } else if (n == 16 && !strcmp(f[0], "profile") && state.nprofiles < MAX_PROFILES) {
            struct profile *p = &state.profiles[state.nprofiles++];
            unsigned *nums[] = {&p->index, &p->id, &p->slices, &p->instances, &p->sm, &p->ce,
                                &p->dec, &p->enc, &p->jpeg, &p->ofa};
            p->gpu = atoi(f[1]);
            for (int i = 0; i < 10; i++)
                *nums[i] = u(f[2 + i]);
            p->memory_mb = strtoull(f[12], NULL, 10);
            copy_field(p->name, sizeof p->name, f[13]);
            p->placement_size = u(f[14]);
            char *save = NULL;
            for (char *s = strtok_r(f[15], ",", &save); s && p->nstarts < MAX_PLACEMENTS;
                 s = strtok_r(NULL, ",", &save))
                p->starts[p->nstarts++] = u(s);
        } else if (n == 19 && !strcmp(f[0], "mig") && state.nmigs < MAX_MIGS) {
            int index = state.nmigs++;
            struct mig *m = &state.migs[index];
            unsigned *nums[] = {&m->gi, &m->ci, &m->gi_profile_id, &m->gi_start, &m->gi_size, &m->ci_start,
                                &m->ci_size, &m->gi_slices, &m->ci_slices, &m->sm, &m->ce, &m->dec,
                                &m->enc, &m->jpeg, &m->ofa};
            m->tag = (struct tag){KIND_MIG, index};
            m->gi_tag = (struct tag){KIND_GI, index};
            m->ci_tag = (struct tag){KIND_CI, index};
            m->gpu = atoi(f[1]);
            copy_field(m->uuid, sizeof m->uuid, f[2]);
            for (int i = 0; i < 15; i++)
                *nums[i] = u(f[3 + i]);
            m->memory_mb = strtoull(f[18], NULL, 10);
        } else if (n == 4 && !strcmp(f[0], "fail") && state.nfails < MAX_FAILS) {
            struct fail *x = &state.fails[state.nfails++];
            copy_field(x->function, sizeof x->function, f[1]);
            x->gpu = strcmp(f[2], "*") ? atoi(f[2]) : -1;
            x->code = atoi(f[3]);
        } else if (n > 0) {
            /* A line this fake does not understand: fail loudly rather than serve a different node. */
            fprintf(stderr, "fake NVML: bad config line starting with %s (%d fields)\n", f[0], n);
            fclose(file);
            return NVML_ERROR_UNKNOWN;
        }
    }
    fclose(file);
    return NVML_SUCCESS;
}

/* The configured failure of `function` for GPU position `gpu` (-1: a call without a device). */
static nvmlReturn_t injected(const char *function, int gpu) {
    for (int i = 0; i < state.nfails; i++)
        if (!strcmp(state.fails[i].function, function) && (state.fails[i].gpu < 0 || state.fails[i].gpu == gpu))
            return state.fails[i].code;
    return NVML_SUCCESS;
}

static struct gpu *as_gpu(void *handle) {
    struct tag *t = handle;
    return t && t->kind == KIND_GPU ? &state.gpus[t->index] : NULL;
}

static struct mig *as_kind(void *handle, int kind) {
    struct tag *t = handle;
    return t && t->kind == kind ? &state.migs[t->index] : NULL;
}

/* The GPU position a device handle (full GPU or MIG) belongs to, or -1. */
static int gpu_of(void *handle) {
    struct gpu *g = as_gpu(handle);
    struct mig *m = as_kind(handle, KIND_MIG);
    return g ? g->tag.index : m ? m->gpu : -1;
}

#define ENTER(name, handle)                                                \
    do {                                                                   \
        if (!state.initialized)                                            \
            return NVML_ERROR_UNINITIALIZED;                               \
        int gpu_ = (handle) ? gpu_of(handle) : -1;                         \
        if (gpu_ >= 0 && state.gpus[gpu_].lost)                            \
            return NVML_ERROR_GPU_IS_LOST;                                 \
        nvmlReturn_t forced_ = injected(name, gpu_);                       \
        if (forced_ != NVML_SUCCESS)                                       \
            return forced_;                                                \
    } while (0)

static nvmlReturn_t put_string(char *out, unsigned length, const char *value) {
    if (!out || strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static void close_event_set(void) {
    if (event_set.fd >= 0)
        close(event_set.fd);
    if (event_set.writer_fd >= 0)
        close(event_set.writer_fd);
    event_set = (struct event_set){.fd = -1, .writer_fd = -1};
}

/* Read a changed config under a running process, keeping the reference count and the health
   state of the GPUs that are still there; a config that cannot be read leaves everything as it was. */
static void reload_config(void) {
    static __typeof__(state) before;
    memcpy(&before, &state, sizeof state);
    if (load_config() != NVML_SUCCESS) {
        memcpy(&state, &before, sizeof state);
        return;
    }
    state.initialized = before.initialized;
    for (int i = 0; i < state.ngpus; i++)
        for (int j = 0; j < before.ngpus; j++)
            if (!strcmp(state.gpus[i].uuid, before.gpus[j].uuid)) {
                struct gpu *g = &state.gpus[i], *old = &before.gpus[j];
                g->lost = old->lost;
                g->temperature = old->temperature;
                g->remap_pending = old->remap_pending;
                g->remap_failure = old->remap_failure;
                g->ecc_uncorrected = old->ecc_uncorrected;
                g->registered_events = old->registered_events;
            }
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (state.initialized) {
        if (config_changed())
            reload_config();
        state.initialized++;
        return NVML_SUCCESS;
    }
    nvmlReturn_t ret = load_config();
    if (ret != NVML_SUCCESS)
        return ret;
    nvmlReturn_t forced = injected("nvmlInitWithFlags", -1);
    if (forced != NVML_SUCCESS)
        return forced;
    state.initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (--state.initialized == 0)
        close_event_set();
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    return result == NVML_SUCCESS ? "Success" : "Fake NVML error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    ENTER("nvmlSystemGetDriverVersion", NULL);
    return put_string(version, length, state.driver);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER("nvmlSystemGetCudaDriverVersion", NULL);
    *version = state.cuda;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    ENTER("nvmlDeviceGetCount_v2", NULL);
    *count = (unsigned)state.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned)state.ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t forced = injected("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (forced != NVML_SUCCESS)
        return forced;
    *device = &state.gpus[index].tag;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned length) {
    ENTER("nvmlDeviceGetUUID", device);
    struct gpu *g = as_gpu(device);
    struct mig *m = as_kind(device, KIND_MIG);
    if (!g && !m)
        return NVML_ERROR_INVALID_ARGUMENT;
    return put_string(uuid, length, g ? g->uuid : m->uuid);
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned length) {
    ENTER("nvmlDeviceGetName", device);
    struct gpu *g = as_gpu(device);
    return g ? put_string(name, length, g->name) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetBrand(void *device, unsigned *brand) {
    ENTER("nvmlDeviceGetBrand", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *brand = g->brand;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(void *device, unsigned *arch) {
    ENTER("nvmlDeviceGetArchitecture", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = g->arch;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    ENTER("nvmlDeviceGetCudaComputeCapability", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->memory;
    memory->free = g->memory;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo_v2", device);
    struct gpu *g = as_gpu(device);
    /* nvmlMemory_v2 = sizeof(nvmlMemory_v2_t) | 2 << 24, as NVML checks it. */
    if (!g || memory->version != ((unsigned)sizeof(nvmlMemory_v2_t) | 2u << 24))
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->memory;
    memory->reserved = 0;
    memory->free = g->memory;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    ENTER("nvmlDeviceGetPciInfo_v3", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    copy_field(pci->busId, sizeof pci->busId, g->bus_id);
    sscanf(g->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(void *device, unsigned *minor) {
    ENTER("nvmlDeviceGetMinorNumber", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(void *device, unsigned *node) {
    ENTER("nvmlDeviceGetNumaNodeId", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)g->numa;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned *current, unsigned *pending) {
    ENTER("nvmlDeviceGetMigMode", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)g->mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned *count) {
    ENTER("nvmlDeviceGetMaxMigDeviceCount", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g->mig_mode == 1 ? 7 : 0;
    return NVML_SUCCESS;
}

/* The index-th MIG device of a GPU; slots past the last one are empty, as on real hardware. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned index, void **mig) {
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex", device);
    struct gpu *g = as_gpu(device);
    if (!g || index >= 7)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned seen = 0;
    for (int i = 0; i < state.nmigs; i++)
        if (state.migs[i].gpu == g->tag.index && seen++ == index) {
            *mig = &state.migs[i].tag;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned *id) {
    ENTER("nvmlDeviceGetGpuInstanceId", device);
    struct mig *m = as_kind(device, KIND_MIG);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned *id) {
    ENTER("nvmlDeviceGetComputeInstanceId", device);
    struct mig *m = as_kind(device, KIND_MIG);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(void *device, nvmlDeviceAttributes_t *attributes) {
    ENTER("nvmlDeviceGetAttributes_v2", device);
    struct mig *m = as_kind(device, KIND_MIG);
    if (!m)
        return NVML_ERROR_NOT_SUPPORTED;
    *attributes = (nvmlDeviceAttributes_t){m->sm, m->ce, m->dec, m->enc, m->jpeg, m->ofa,
                                           m->gi_slices, m->ci_slices, m->memory_mb};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *device, unsigned id, void **instance) {
    ENTER("nvmlDeviceGetGpuInstanceById", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < state.nmigs; i++)
        if (state.migs[i].gpu == g->tag.index && state.migs[i].gi == id) {
            *instance = &state.migs[i].gi_tag;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(void *instance, nvmlGpuInstanceInfo_t *info) {
    struct mig *m = as_kind(instance, KIND_GI);
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t forced = injected("nvmlGpuInstanceGetInfo", m->gpu);
    if (forced != NVML_SUCCESS)
        return forced;
    *info = (nvmlGpuInstanceInfo_t){&state.gpus[m->gpu].tag, m->gi, m->gi_profile_id, {m->gi_start, m->gi_size}};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *instance, unsigned id, void **compute) {
    struct mig *gi = as_kind(instance, KIND_GI);
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < state.nmigs; i++)
        if (state.migs[i].gpu == gi->gpu && state.migs[i].gi == gi->gi && state.migs[i].ci == id) {
            *compute = &state.migs[i].ci_tag;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *compute, nvmlComputeInstanceInfo_t *info) {
    struct mig *m = as_kind(compute, KIND_CI);
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlComputeInstanceInfo_t){&state.gpus[m->gpu].tag, &m->gi_tag, m->ci, 0, {m->ci_start, m->ci_size}};
    return NVML_SUCCESS;
}

static struct profile *find_profile(int gpu, int by_index, unsigned key) {
    for (int i = 0; i < state.nprofiles; i++)
        if (state.profiles[i].gpu == gpu && (by_index ? state.profiles[i].index : state.profiles[i].id) == key)
            return &state.profiles[i];
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *device, unsigned index, nvmlGpuInstanceProfileInfo_v2_t *info) {
    ENTER("nvmlDeviceGetGpuInstanceProfileInfoV", device);
    struct gpu *g = as_gpu(device);
    if (!g || info->version != ((unsigned)sizeof(nvmlGpuInstanceProfileInfo_v2_t) | 2u << 24))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    struct profile *p = find_profile(g->tag.index, 1, index);
    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    *info = (nvmlGpuInstanceProfileInfo_v2_t){info->version, p->id, 0, p->slices, p->instances, p->sm, p->ce,
                                               p->dec, p->enc, p->jpeg, p->ofa, p->memory_mb, {0}};
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *device, unsigned profile_id, nvmlPlacement_t *placements,
                                                           unsigned *count) {
    ENTER("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device);
    struct gpu *g = as_gpu(device);
    struct profile *p = g ? find_profile(g->tag.index, 0, profile_id) : NULL;
    if (!p || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!placements) {
        *count = p->nstarts;
        return NVML_SUCCESS;
    }
    if (*count < p->nstarts)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < p->nstarts; i++)
        placements[i] = (nvmlPlacement_t){p->starts[i], p->placement_size};
    *count = p->nstarts;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < state.ngpus; i++)
        if (!strcmp(state.gpus[i].uuid, uuid)) {
            if (state.gpus[i].lost)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &state.gpus[i].tag;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, unsigned sensor, unsigned *temperature) {
    ENTER("nvmlDeviceGetTemperature", device);
    struct gpu *g = as_gpu(device);
    if (!g || sensor != 0 || !temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temperature = g->temperature;
    return NVML_SUCCESS;
}

/* errorType 1 = uncorrected, counterType 0 = volatile: the only counter this fake keeps. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, unsigned error_type, unsigned counter_type,
                                         unsigned long long *count) {
    ENTER("nvmlDeviceGetTotalEccErrors", device);
    struct gpu *g = as_gpu(device);
    if (!g || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = error_type == 1 && counter_type == 0 ? g->ecc_uncorrected : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned *corrected, unsigned *uncorrected, unsigned *pending,
                                       unsigned *failure) {
    ENTER("nvmlDeviceGetRemappedRows", device);
    struct gpu *g = as_gpu(device);
    if (!g || !corrected || !uncorrected || !pending || !failure)
        return NVML_ERROR_INVALID_ARGUMENT;
    *corrected = *uncorrected = 0;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    return NVML_SUCCESS;
}

static int g_mig_capable(void *device) {
    struct gpu *g = as_gpu(device);
    return g && g->mig_mode >= 0;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    ENTER("nvmlDeviceGetSupportedEventTypes", device);
    if (!as_gpu(device) || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = EVENT_TYPE_SINGLE_BIT_ECC | EVENT_TYPE_DOUBLE_BIT_ECC | EVENT_TYPE_XID |
             (g_mig_capable(device) ? EVENT_TYPE_MIG_CONFIG_CHANGE : 0);
    return NVML_SUCCESS;
}

static struct event_set *as_event_set(void *handle) {
    struct tag *t = handle;
    return t == &event_set.tag && event_set.open ? &event_set : NULL;
}

nvmlReturn_t nvmlEventSetCreate(void **set) {
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t forced = injected("nvmlEventSetCreate", -1);
    if (forced != NVML_SUCCESS)
        return forced;
    if (!set || event_set.open)
        return NVML_ERROR_INVALID_ARGUMENT; /* this fake has a single event set */
    event_set = (struct event_set){.tag = {KIND_EVENT_SET, 0}, .open = 1, .fd = -1, .writer_fd = -1};
    const char *path = getenv("FAKE_NVML_EVENTS");
    if (path) {
        event_set.fd = open(path, O_RDONLY | O_NONBLOCK);
        /* Our own writer keeps the FIFO from reporting end-of-file between the test's writes. */
        event_set.writer_fd = event_set.fd >= 0 ? open(path, O_WRONLY | O_NONBLOCK) : -1;
        if (event_set.fd < 0 || event_set.writer_fd < 0) {
            fprintf(stderr, "fake NVML: cannot open events FIFO %s: %s\n", path, strerror(errno));
            close_event_set();
            return NVML_ERROR_UNKNOWN;
        }
    }
    *set = &event_set.tag;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    if (!as_event_set(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    close_event_set();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    ENTER("nvmlDeviceRegisterEvents", device);
    struct gpu *g = as_gpu(device);
    if (!g || !as_event_set(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    g->registered_events |= types;
    return NVML_SUCCESS;
}

/* Take one complete line out of the event set's buffer; 0 when there is none yet. */
static int next_line(char *line, size_t size) {
    char *end = memchr(event_set.buf, '\n', event_set.len);
    if (!end)
        return 0;
    size_t n = (size_t)(end - event_set.buf);
    snprintf(line, size, "%.*s", (int)n, event_set.buf);
    memmove(event_set.buf, end + 1, event_set.len - n - 1);
    event_set.len -= n + 1;
    return 1;
}

/* Apply one FIFO command: an event (NVML_SUCCESS with `data` filled), NVML_ERROR_GPU_IS_LOST,
   or NO_EVENT for commands that only change state (and for lines it cannot use). */
static nvmlReturn_t apply_command(const char *line, nvmlEventData_t *data) {
    char verb[16] = "";
    long long a[4] = {-1, -1, -1, -1};
    int n = sscanf(line, "%15s %lld %lld %lld %lld", verb, &a[0], &a[1], &a[2], &a[3]);
    if (n < 2 || a[0] < 0 || a[0] >= state.ngpus) {
        fprintf(stderr, "fake NVML: bad events line: %s\n", line);
        return NO_EVENT;
    }
    struct gpu *g = &state.gpus[a[0]];
    if (!strcmp(verb, "xid") && (n == 3 || n == 5)) {
        if (!(g->registered_events & EVENT_TYPE_XID) || g->lost)
            return NO_EVENT;
        *data = (nvmlEventData_t){&g->tag, EVENT_TYPE_XID, (unsigned long long)a[1],
                                  n == 5 ? (unsigned)a[2] : WHOLE_GPU, n == 5 ? (unsigned)a[3] : WHOLE_GPU};
        return NVML_SUCCESS;
    }
    if (!strcmp(verb, "mig") && n == 2) {
        if (!(g->registered_events & EVENT_TYPE_MIG_CONFIG_CHANGE) || g->lost)
            return NO_EVENT;
        *data = (nvmlEventData_t){&g->tag, EVENT_TYPE_MIG_CONFIG_CHANGE, 0, WHOLE_GPU, WHOLE_GPU};
        return NVML_SUCCESS;
    }
    if (!strcmp(verb, "lost") && n == 2) {
        g->lost = 1;
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (!strcmp(verb, "found") && n == 2)
        g->lost = 0;
    else if (!strcmp(verb, "temp") && n == 3)
        g->temperature = (unsigned)a[1];
    else if (!strcmp(verb, "ecc") && n == 3)
        g->ecc_uncorrected = (unsigned long long)a[1];
    else if (!strcmp(verb, "remap") && n == 4) {
        g->remap_pending = (unsigned)a[1];
        g->remap_failure = (unsigned)a[2];
    } else
        fprintf(stderr, "fake NVML: bad events line: %s\n", line);
    return NO_EVENT;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!as_event_set(set) || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        char line[256];
        while (next_line(line, sizeof line)) {
            nvmlReturn_t ret = apply_command(line, data);
            if (ret != NO_EVENT)
                return ret;
        }
        long long left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        struct pollfd p = {event_set.fd, POLLIN, 0};
        int ready = poll(&p, event_set.fd >= 0 ? 1 : 0, (int)left);
        if (ready < 0 && errno != EINTR)
            return NVML_ERROR_UNKNOWN;
        if (ready > 0) {
            ssize_t got = read(event_set.fd, event_set.buf + event_set.len, sizeof event_set.buf - event_set.len);
            if (got > 0)
                event_set.len += (size_t)got;
            else if (event_set.len == sizeof event_set.buf)
                event_set.len = 0; /* a line longer than the buffer: drop it rather than spin */
        }
    }
}
