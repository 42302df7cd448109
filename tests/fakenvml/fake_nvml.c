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
 *            ADDRESSING_MODE MODULE_ID
 *            NUMA -1: not reported; MIG_MODE -1: not MIG-capable, 0: disabled, 1: enabled;
 *            ADDRESSING_MODE -1: not supported, else NVML_DEVICE_ADDRESSING_MODE_*; MODULE_ID 0: none
 *   profile  GPU INDEX ID SLICES INSTANCES SM CE DEC ENC JPEG OFA MEMORY_MB NAME PLACEMENT_SIZE STARTS
 *            STARTS is a comma-separated list of placement starts
 *   mig      GPU UUID GI CI GI_PROFILE_ID GI_START GI_SIZE CI_START CI_SIZE GI_SLICES CI_SLICES
 *            SM CE DEC ENC JPEG OFA MEMORY_MB
 *            a MIG device: a compute instance in GPU instance GI (created by the first line naming it)
 *   gi       GPU GI PROFILE_ID START SIZE      a GPU instance without compute instances
 *   fail     FUNCTION GPU CODE        FUNCTION returns CODE for GPU (its position, or * for all);
 *                                     CODE -9: the process kills itself with SIGKILL in FUNCTION
 *   slow     FUNCTION MS              FUNCTION takes MS milliseconds (MIG reconfiguration is slow)
 *   serial   N                        numbers the next MIG device UUID this fake makes
 *
 * GPU is the position of the gpu line (the NVML index).
 *
 * MIG reconfiguration, as NVML does it: nvmlDeviceCreateGpuInstanceWithPlacement (errors:
 * INVALID_ARGUMENT for a placement the profile lacks, INSUFFICIENT_RESOURCES when it overlaps an
 * instance or the profile has no instance left), nvmlGpuInstanceCreateComputeInstance
 * (INSUFFICIENT_RESOURCES when the compute slices are taken), nvmlComputeInstanceDestroy,
 * nvmlGpuInstanceDestroy (IN_USE while it has compute instances). The environment variable
 * FAKE_NVML_STATE names a file that holds the node's MIG devices across processes, as the GPU
 * does across a crash of its user: when it exists it replaces the config's mig/gi lines, and
 * every reconfiguration rewrites it (atomically). This fake is stricter than NVML in one way: a
 * reconfiguration call that overlaps another on the same GPU fails with IN_USE (and says so on
 * stderr), so callers that do not serialize them are caught.
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
 *   recovery GPU ACTION      what nvmlDeviceGetFieldValues answers for NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
 *                            from now on (no event; NVML's action number, 0 none .. 7 system reboot;
 *                            default -1: the field is not supported, as on host drivers before it)
 *   mig GPU                  a MIG config change event (nvmlEventMigConfigChange), delivered only if
 *                            the GPU registered for it; rewrite the config file first
 *
 * Telemetry, in a build with -DFAKE_NVML_TELEMETRY_CALLS (harness.build_library(telemetry=True);
 * without it the telemetry symbols are absent, as on a driver without them): the environment
 * variable FAKE_NVML_TELEMETRY names a file that every telemetry call reads again when it changed (so a test can change the figures under a running reader). Lines
 * (fields separated by spaces; GPU is the NVML index; a GPU with no line is idle):
 *
 *   util GPU SM MEM                  utilisation rates in percent (default 0 0)
 *   power GPU MILLIWATTS             power draw (default 70000)
 *   clocks GPU SM_MHZ MEM_MHZ        current clocks (default 1980 2619)
 *   reasons GPU MASK                 clock event reasons (default 1: GPU idle)
 *   used GPU BYTES                   framebuffer memory in use (default: its processes' sum)
 *   nvlink GPU LINKS UP_MASK         LINKS links, those in UP_MASK up (default: no NVLink)
 *   proc GPU PID BYTES SM            a compute process (SM -1: no utilisation sample)
 *
 * MIG devices answer memory info (their own size, nothing used) and an empty process list;
 * utilisation, power and clocks are NOT_SUPPORTED on them, as on real MIG devices.
 *
 * Host driver reloads: the environment variable FAKE_NVML_UNLOADED names a file; while it exists the
 * host driver is unloaded, as during an upgrade by the GPU operator's driver manager: every call
 * answers NVML_ERROR_DRIVER_NOT_LOADED (nvmlInit too) and what the process had initialised is gone.
 * Once the file is removed, calls answer NVML_ERROR_UNINITIALIZED until nvmlInit, which reads the
 * config again (write another `driver` version into it first to model an upgrade).
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
#include <pthread.h>
#include <signal.h>
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
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_UNKNOWN = 999,
};

/* Real NVML is thread-safe, and serve calls it from several threads (health, rescan, telemetry):
   every exported call holds this lock, or a re-initialisation (which reloads the whole table)
   could be seen half-done by another thread's enumeration. Recursive: calls call calls. */
static pthread_mutex_t nvml_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void nvml_unlock(int *locked) {
    if (*locked)
        pthread_mutex_unlock(&nvml_lock);
}
#define GUARD                                                                      \
    pthread_mutex_lock(&nvml_lock);                                                \
    __attribute__((cleanup(nvml_unlock))) int nvml_locked_ = 1

#define EVENT_TYPE_SINGLE_BIT_ECC 0x1ULL
#define EVENT_TYPE_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_TYPE_XID 0x8ULL
#define EVENT_TYPE_MIG_CONFIG_CHANGE 0x100ULL
#define WHOLE_GPU 0xFFFFFFFFu
/* What a line on the events FIFO produced when it is not an event. */
#define NO_EVENT (-1)

#ifndef MAX_GPUS
#define MAX_GPUS 64 /* build with -DMAX_GPUS=128 for the prepare benchmarks' 128 */
#endif
#define MAX_PROFILES 256
#define MAX_GIS 256
#define MAX_CIS 512
#define MAX_GI_ID 14
#define MAX_CIS_PER_GI 8
/* A fail line's CODE that makes the process kill itself, as kill -9 would. */
#define KILL_CODE (-9)
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
    int cc_major, cc_minor, numa, mig_mode, addressing_mode;
    unsigned module_id;
    unsigned long long memory;
    char uuid[96], name[96], bus_id[32];
    /* Health state, changed through the events FIFO. */
    int lost;
    unsigned temperature, remap_pending, remap_failure;
    int recovery; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; -1: not supported */
    unsigned long long ecc_uncorrected, registered_events;
};

struct profile {
    int gpu;
    unsigned index, id, slices, instances, sm, ce, dec, enc, jpeg, ofa, placement_size, nstarts;
    unsigned long long memory_mb;
    unsigned starts[MAX_PLACEMENTS];
    char name[96];
};

/* A GPU instance; its handle is &tag. Slots of destroyed instances are reused. */
struct gi {
    struct tag tag;
    int alive, gpu;
    unsigned id, profile_id, start, size;
};

/* A compute instance in gis[gi]: the MIG device (handle &tag) and the compute instance (&ci_tag). */
struct ci {
    struct tag tag, ci_tag;
    int alive, gi;
    unsigned id, start, size, gi_slices, ci_slices, sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mb;
    char uuid[96];
};

struct fail {
    char function[64];
    int gpu; /* -1: every GPU */
    nvmlReturn_t code;
};

struct slow {
    char function[64];
    unsigned ms;
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
    int ngpus, nprofiles, ngis, ncis, nfails, nslows;
    unsigned serial;
    struct gpu gpus[MAX_GPUS];
    struct profile profiles[MAX_PROFILES];
    struct gi gis[MAX_GIS];
    struct ci cis[MAX_CIS];
    struct fail fails[MAX_FAILS];
    struct slow slows[MAX_FAILS];
    int reconfiguring[MAX_GPUS];
} state;

/* Guards the GPU and compute instance tables, which reconfiguration changes while other threads read. */
static pthread_mutex_t mig_lock = PTHREAD_MUTEX_INITIALIZER;

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
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* pynvml's c_nvmlFieldValue_t. */
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned valueType;
    nvmlReturn_t nvmlReturn;
    union {
        double dVal;
        unsigned uiVal;
        unsigned long long ullVal;
    } value;
} nvmlFieldValue_t;

#define FI_DEV_GET_GPU_RECOVERY_ACTION 230u
#define VALUE_TYPE_UNSIGNED_INT 1u

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

static struct gi *find_gi(int gpu, unsigned id) {
    for (int i = 0; i < state.ngis; i++)
        if (state.gis[i].alive && state.gis[i].gpu == gpu && state.gis[i].id == id)
            return &state.gis[i];
    return NULL;
}

static struct gi *add_gi(int gpu, unsigned id, unsigned profile_id, unsigned start, unsigned size) {
    int index = 0;
    while (index < state.ngis && state.gis[index].alive)
        index++;
    if (index == MAX_GIS)
        return NULL;
    if (index == state.ngis)
        state.ngis++;
    state.gis[index] = (struct gi){{KIND_GI, index}, 1, gpu, id, profile_id, start, size};
    return &state.gis[index];
}

static struct ci *add_ci(int gi) {
    int index = 0;
    while (index < state.ncis && state.cis[index].alive)
        index++;
    if (index == MAX_CIS)
        return NULL;
    if (index == state.ncis)
        state.ncis++;
    struct ci *c = &state.cis[index];
    memset(c, 0, sizeof *c);
    c->tag = (struct tag){KIND_MIG, index};
    c->ci_tag = (struct tag){KIND_CI, index};
    c->alive = 1;
    c->gi = gi;
    return c;
}

/* A gi, mig or serial line (config or state file); 0 if the line is none of those. */
static int parse_mig_line(char **f, int n) {
    if (n == 6 && !strcmp(f[0], "gi")) {
        int gpu = atoi(f[1]);
        if (!find_gi(gpu, u(f[2])))
            add_gi(gpu, u(f[2]), u(f[3]), u(f[4]), u(f[5]));
        return 1;
    }
    if (n == 19 && !strcmp(f[0], "mig")) {
        int gpu = atoi(f[1]);
        struct gi *g = find_gi(gpu, u(f[3]));
        if (!g)
            g = add_gi(gpu, u(f[3]), u(f[5]), u(f[6]), u(f[7]));
        struct ci *c = g ? add_ci(g->tag.index) : NULL;
        if (!c)
            return 1;
        unsigned *nums[] = {&c->start, &c->size, &c->gi_slices, &c->ci_slices, &c->sm, &c->ce,
                            &c->dec, &c->enc, &c->jpeg, &c->ofa};
        copy_field(c->uuid, sizeof c->uuid, f[2]);
        c->id = u(f[4]);
        for (int i = 0; i < 10; i++)
            *nums[i] = u(f[8 + i]);
        c->memory_mb = strtoull(f[18], NULL, 10);
        return 1;
    }
    if (n == 2 && !strcmp(f[0], "serial")) {
        state.serial = u(f[1]);
        return 1;
    }
    return 0;
}

/* The MIG devices of the state file, when there is one; 1 if it was read. */
static int load_state(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *file = path ? fopen(path, "r") : NULL;
    char line[1024], *f[24];
    if (!file)
        return 0;
    while (fgets(line, sizeof line, file))
        parse_mig_line(f, split_tabs(line, f, 24));
    fclose(file);
    return 1;
}

/* Write every GPU and compute instance to the state file: a temporary file, then rename. A process
   crash cannot tear it; surviving power loss, the only reason to fsync, is not this fake's job. */
static void save_state(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    char tmp[4096];
    if (!path)
        return;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *file = fopen(tmp, "w");
    if (!file) {
        fprintf(stderr, "fake NVML: cannot write %s: %s\n", tmp, strerror(errno));
        return;
    }
    fprintf(file, "serial\t%u\n", state.serial);
    for (int i = 0; i < state.ngis; i++) {
        struct gi *g = &state.gis[i];
        if (g->alive)
            fprintf(file, "gi\t%d\t%u\t%u\t%u\t%u\n", g->gpu, g->id, g->profile_id, g->start, g->size);
    }
    for (int i = 0; i < state.ncis; i++) {
        struct ci *c = &state.cis[i];
        struct gi *g = &state.gis[c->gi];
        if (c->alive)
            fprintf(file, "mig\t%d\t%s\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%u\t%llu\n",
                    g->gpu, c->uuid, g->id, c->id, g->profile_id, g->start, g->size, c->start, c->size,
                    c->gi_slices, c->ci_slices, c->sm, c->ce, c->dec, c->enc, c->jpeg, c->ofa, c->memory_mb);
    }
    fclose(file);
    rename(tmp, path);
}

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
    /* The state file, when there is one, knows the MIG devices better than the config. */
    int from_state = load_state();
    fstat(fileno(file), &config_seen);
    while (fgets(line, sizeof line, file)) {
        int n = split_tabs(line, f, 24);
        if (n == 2 && !strcmp(f[0], "driver")) {
            copy_field(state.driver, sizeof state.driver, f[1]);
        } else if (n == 2 && !strcmp(f[0], "cuda")) {
            state.cuda = atoi(f[1]);
        } else if (n == 14 && !strcmp(f[0], "gpu") && state.ngpus < MAX_GPUS) {
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
            g->addressing_mode = atoi(f[12]);
            g->module_id = u(f[13]);
            g->temperature = 40;
            g->recovery = -1;
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
        } else if ((n == 19 && !strcmp(f[0], "mig")) || (n == 6 && !strcmp(f[0], "gi")) ||
                   (n == 2 && !strcmp(f[0], "serial"))) {
            if (!from_state)
                parse_mig_line(f, n);
        } else if (n == 4 && !strcmp(f[0], "fail") && state.nfails < MAX_FAILS) {
            struct fail *x = &state.fails[state.nfails++];
            copy_field(x->function, sizeof x->function, f[1]);
            x->gpu = strcmp(f[2], "*") ? atoi(f[2]) : -1;
            x->code = atoi(f[3]);
        } else if (n == 3 && !strcmp(f[0], "slow") && state.nslows < MAX_FAILS) {
            struct slow *x = &state.slows[state.nslows++];
            copy_field(x->function, sizeof x->function, f[1]);
            x->ms = u(f[2]);
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
        if (!strcmp(state.fails[i].function, function) && (state.fails[i].gpu < 0 || state.fails[i].gpu == gpu)) {
            if (state.fails[i].code == KILL_CODE)
                kill(getpid(), SIGKILL);
            return state.fails[i].code;
        }
    return NVML_SUCCESS;
}

static struct gpu *as_gpu(void *handle) {
    struct tag *t = handle;
    return t && t->kind == KIND_GPU ? &state.gpus[t->index] : NULL;
}

/* A live compute instance by its MIG device handle (KIND_MIG) or compute instance handle (KIND_CI). */
static struct ci *as_ci(void *handle, int kind) {
    struct tag *t = handle;
    struct ci *c = t && t->kind == kind ? &state.cis[t->index] : NULL;
    return c && c->alive ? c : NULL;
}

static struct gi *as_gi(void *handle) {
    struct tag *t = handle;
    struct gi *g = t && t->kind == KIND_GI ? &state.gis[t->index] : NULL;
    return g && g->alive ? g : NULL;
}

/* The GPU position a device handle (full GPU or MIG) belongs to, or -1. */
static int gpu_of(void *handle) {
    struct gpu *g = as_gpu(handle);
    struct ci *c = as_ci(handle, KIND_MIG);
    return g ? g->tag.index : c ? state.gis[c->gi].gpu : -1;
}

static void close_event_set(void);

/* Whether the host driver is unloaded (see FAKE_NVML_UNLOADED); the process's NVML state goes with it. */
static int driver_unloaded(void) {
    const char *path = getenv("FAKE_NVML_UNLOADED");
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return 0;
    if (state.initialized) {
        state.initialized = 0;
        close_event_set();
    }
    return 1;
}

#define ENTER(name, handle)                                                \
    do {                                                                   \
        if (driver_unloaded())                                             \
            return NVML_ERROR_DRIVER_NOT_LOADED;                           \
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
                g->recovery = old->recovery;
                g->ecc_uncorrected = old->ecc_uncorrected;
                g->registered_events = old->registered_events;
            }
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    GUARD;
    (void)flags;
    if (driver_unloaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
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
    GUARD;
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
    GUARD;
    ENTER("nvmlSystemGetDriverVersion", NULL);
    return put_string(version, length, state.driver);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    GUARD;
    ENTER("nvmlSystemGetCudaDriverVersion", NULL);
    *version = state.cuda;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    GUARD;
    ENTER("nvmlDeviceGetCount_v2", NULL);
    *count = (unsigned)state.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    GUARD;
    if (driver_unloaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
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
    GUARD;
    pthread_mutex_lock(&mig_lock);
    nvmlReturn_t ret = injected("nvmlDeviceGetUUID", gpu_of(device));
    struct gpu *g = as_gpu(device);
    struct ci *c = as_ci(device, KIND_MIG);
    if (!state.initialized)
        ret = NVML_ERROR_UNINITIALIZED;
    else if (ret == NVML_SUCCESS && !g && !c)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (ret == NVML_SUCCESS && state.gpus[gpu_of(device)].lost)
        ret = NVML_ERROR_GPU_IS_LOST;
    else if (ret == NVML_SUCCESS)
        ret = put_string(uuid, length, g ? g->uuid : c->uuid);
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned length) {
    GUARD;
    ENTER("nvmlDeviceGetName", device);
    struct gpu *g = as_gpu(device);
    return g ? put_string(name, length, g->name) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetBrand(void *device, unsigned *brand) {
    GUARD;
    ENTER("nvmlDeviceGetBrand", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *brand = g->brand;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(void *device, unsigned *arch) {
    GUARD;
    ENTER("nvmlDeviceGetArchitecture", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = g->arch;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    GUARD;
    ENTER("nvmlDeviceGetCudaComputeCapability", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

#ifdef FAKE_NVML_TELEMETRY_CALLS
static unsigned long long telemetry_used(void *device);
#endif

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    GUARD;
    ENTER("nvmlDeviceGetMemoryInfo", device);
    struct gpu *g = as_gpu(device);
#ifdef FAKE_NVML_TELEMETRY_CALLS
    struct ci *mig = as_ci(device, KIND_MIG);
    if (mig) {
        memory->total = memory->free = mig->memory_mb * 1024 * 1024;
        memory->used = 0;
        return NVML_SUCCESS;
    }
#endif
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->memory;
#ifdef FAKE_NVML_TELEMETRY_CALLS
    memory->used = telemetry_used(device);
    memory->free = g->memory - memory->used;
#else
    memory->free = g->memory;
    memory->used = 0;
#endif
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    GUARD;
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
    GUARD;
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
    GUARD;
    ENTER("nvmlDeviceGetMinorNumber", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(void *device, unsigned *node) {
    GUARD;
    ENTER("nvmlDeviceGetNumaNodeId", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)g->numa;
    return NVML_SUCCESS;
}

/* nvmlDeviceAddressingMode_t: a versioned struct whose second field is the mode. */
typedef struct {
    unsigned version, value;
} nvmlDeviceAddressingMode_t;

nvmlReturn_t nvmlDeviceGetAddressingMode(void *device, nvmlDeviceAddressingMode_t *mode) {
    GUARD;
    ENTER("nvmlDeviceGetAddressingMode", device);
    struct gpu *g = as_gpu(device);
    if (!g || !mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->addressing_mode < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    mode->value = (unsigned)g->addressing_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetModuleId(void *device, unsigned *module_id) {
    GUARD;
    ENTER("nvmlDeviceGetModuleId", device);
    struct gpu *g = as_gpu(device);
    if (!g || !module_id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *module_id = g->module_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned *current, unsigned *pending) {
    GUARD;
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
    GUARD;
    ENTER("nvmlDeviceGetMaxMigDeviceCount", device);
    struct gpu *g = as_gpu(device);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g->mig_mode == 1 ? 7 : 0;
    return NVML_SUCCESS;
}

/* The index-th MIG device of a GPU; slots past the last one are empty, as on real hardware. */
static nvmlReturn_t mig_device_by_index(struct gpu *g, unsigned index, void **mig) {
    unsigned seen = 0;
    for (int i = 0; i < state.ncis; i++)
        if (state.cis[i].alive && state.gis[state.cis[i].gi].gpu == g->tag.index && seen++ == index) {
            *mig = &state.cis[i].tag;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned index, void **mig) {
    GUARD;
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex", device);
    struct gpu *g = as_gpu(device);
    if (!g || index >= 7)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mig_lock);
    nvmlReturn_t ret = mig_device_by_index(g, index, mig);
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

/* Reads of one live compute instance, under the lock: `what` 0 GI id, 1 CI id, 2 attributes. */
static nvmlReturn_t read_ci(const char *name, void *device, int what, unsigned *id, nvmlDeviceAttributes_t *attributes) {
    pthread_mutex_lock(&mig_lock);
    nvmlReturn_t ret = state.initialized ? injected(name, gpu_of(device)) : NVML_ERROR_UNINITIALIZED;
    struct ci *c = as_ci(device, KIND_MIG);
    if (ret == NVML_SUCCESS && !c)
        ret = what == 2 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        if (what == 0)
            *id = state.gis[c->gi].id;
        else if (what == 1)
            *id = c->id;
        else
            *attributes = (nvmlDeviceAttributes_t){c->sm, c->ce, c->dec, c->enc, c->jpeg, c->ofa,
                                                   c->gi_slices, c->ci_slices, c->memory_mb};
    }
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned *id) {
    GUARD;
    return read_ci("nvmlDeviceGetGpuInstanceId", device, 0, id, NULL);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned *id) {
    GUARD;
    return read_ci("nvmlDeviceGetComputeInstanceId", device, 1, id, NULL);
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(void *device, nvmlDeviceAttributes_t *attributes) {
    GUARD;
    return read_ci("nvmlDeviceGetAttributes_v2", device, 2, NULL, attributes);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *device, unsigned id, void **instance) {
    GUARD;
    ENTER("nvmlDeviceGetGpuInstanceById", device);
    struct gpu *g = as_gpu(device);
    if (!g || !instance)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mig_lock);
    struct gi *found = find_gi(g->tag.index, id);
    if (found)
        *instance = &found->tag;
    pthread_mutex_unlock(&mig_lock);
    return found ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(void *instance, nvmlGpuInstanceInfo_t *info) {
    GUARD;
    pthread_mutex_lock(&mig_lock);
    struct gi *g = as_gi(instance);
    nvmlReturn_t ret = !state.initialized ? NVML_ERROR_UNINITIALIZED
                       : !g || !info    ? NVML_ERROR_INVALID_ARGUMENT
                                        : injected("nvmlGpuInstanceGetInfo", g->gpu);
    if (ret == NVML_SUCCESS)
        *info = (nvmlGpuInstanceInfo_t){&state.gpus[g->gpu].tag, g->id, g->profile_id, {g->start, g->size}};
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *instance, unsigned id, void **compute) {
    GUARD;
    pthread_mutex_lock(&mig_lock);
    struct gi *g = as_gi(instance);
    nvmlReturn_t ret = !state.initialized ? NVML_ERROR_UNINITIALIZED
                       : !g || !compute ? NVML_ERROR_INVALID_ARGUMENT
                                        : NVML_ERROR_NOT_FOUND;
    for (int i = 0; g && compute && i < state.ncis; i++)
        if (state.cis[i].alive && state.cis[i].gi == g->tag.index && state.cis[i].id == id) {
            *compute = &state.cis[i].ci_tag;
            ret = NVML_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *compute, nvmlComputeInstanceInfo_t *info) {
    GUARD;
    pthread_mutex_lock(&mig_lock);
    struct ci *c = as_ci(compute, KIND_CI);
    nvmlReturn_t ret = !state.initialized ? NVML_ERROR_UNINITIALIZED
                       : !c || !info    ? NVML_ERROR_INVALID_ARGUMENT
                                        : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) {
        struct gi *g = &state.gis[c->gi];
        *info = (nvmlComputeInstanceInfo_t){&state.gpus[g->gpu].tag, &g->tag, c->id, 0, {c->start, c->size}};
    }
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

static struct profile *find_profile(int gpu, int by_index, unsigned key) {
    for (int i = 0; i < state.nprofiles; i++)
        if (state.profiles[i].gpu == gpu && (by_index ? state.profiles[i].index : state.profiles[i].id) == key)
            return &state.profiles[i];
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *device, unsigned index, nvmlGpuInstanceProfileInfo_v2_t *info) {
    GUARD;
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
    snprintf(info->name, sizeof info->name, "MIG %.80s", p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *device, unsigned profile_id, nvmlPlacement_t *placements,
                                                           unsigned *count) {
    GUARD;
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

/* --- MIG reconfiguration ------------------------------------------------------------------- */

static unsigned slow_ms(const char *function) {
    for (int i = 0; i < state.nslows; i++)
        if (!strcmp(state.slows[i].function, function))
            return state.slows[i].ms;
    return 0;
}

/* Start reconfiguring GPU `gpu`: IN_USE while another call does. On success the lock is held. */
static nvmlReturn_t begin_reconfiguration(const char *function, int gpu) {
    pthread_mutex_lock(&mig_lock);
    if (state.reconfiguring[gpu]) {
        pthread_mutex_unlock(&mig_lock);
        fprintf(stderr, "fake NVML: %s: GPU %d is being reconfigured by another call\n", function, gpu);
        return NVML_ERROR_IN_USE;
    }
    state.reconfiguring[gpu] = 1;
    pthread_mutex_unlock(&mig_lock);
    unsigned ms = slow_ms(function);
    if (ms) {
        struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&mig_lock);
    return NVML_SUCCESS;
}

static nvmlReturn_t end_reconfiguration(int gpu, nvmlReturn_t ret) {
    if (ret == NVML_SUCCESS)
        save_state();
    state.reconfiguring[gpu] = 0;
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

static int slices_overlap(unsigned a_start, unsigned a_size, unsigned b_start, unsigned b_size) {
    return a_start < b_start + b_size && b_start < a_start + a_size;
}

/* Compute slices of the GPU's largest profile: all a GPU has. */
static unsigned compute_slices(int gpu) {
    unsigned most = 0;
    for (int i = 0; i < state.nprofiles; i++)
        if (state.profiles[i].gpu == gpu && state.profiles[i].slices > most)
            most = state.profiles[i].slices;
    return most;
}

static nvmlReturn_t create_gi(struct gpu *g, unsigned profile_id, const nvmlPlacement_t *placement, void **instance) {
    struct profile *p = find_profile(g->tag.index, 0, profile_id);
    int placement_ok = 0;
    for (unsigned i = 0; p && i < p->nstarts; i++)
        placement_ok |= p->starts[i] == placement->start && p->placement_size == placement->size;
    if (!placement_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned same_profile = 0, used_compute = 0;
    int used_ids[MAX_GI_ID + 1] = {0};
    for (int i = 0; i < state.ngis; i++) {
        struct gi *other = &state.gis[i];
        if (!other->alive || other->gpu != g->tag.index)
            continue;
        if (slices_overlap(other->start, other->size, placement->start, placement->size))
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
        struct profile *q = find_profile(g->tag.index, 0, other->profile_id);
        used_compute += q ? q->slices : 0;
        same_profile += other->profile_id == profile_id;
        if (other->id <= MAX_GI_ID)
            used_ids[other->id] = 1;
    }
    if (same_profile >= p->instances || used_compute + p->slices > compute_slices(g->tag.index))
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned id = 1;
    while (id <= MAX_GI_ID && used_ids[id])
        id++;
    struct gi *created = id <= MAX_GI_ID ? add_gi(g->tag.index, id, profile_id, placement->start, placement->size) : NULL;
    if (!created)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *instance = &created->tag;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *device, unsigned profile_id, const nvmlPlacement_t *placement,
                                                      void **instance) {
    GUARD;
    ENTER("nvmlDeviceCreateGpuInstanceWithPlacement", device);
    struct gpu *g = as_gpu(device);
    if (!g || !placement || !instance)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t ret = begin_reconfiguration("nvmlDeviceCreateGpuInstanceWithPlacement", g->tag.index);
    if (ret != NVML_SUCCESS)
        return ret;
    return end_reconfiguration(g->tag.index, create_gi(g, profile_id, placement, instance));
}

nvmlReturn_t nvmlDeviceGetGpuInstances(void *device, unsigned profile_id, void **instances, unsigned *count) {
    GUARD;
    ENTER("nvmlDeviceGetGpuInstances", device);
    struct gpu *g = as_gpu(device);
    if (!g || !count || !find_profile(g->tag.index, 0, profile_id))
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mig_lock);
    unsigned found = 0;
    for (int i = 0; i < state.ngis; i++) {
        struct gi *gi = &state.gis[i];
        if (gi->alive && gi->gpu == g->tag.index && gi->profile_id == profile_id) {
            if (instances)
                instances[found] = &gi->tag;
            found++;
        }
    }
    *count = found;
    pthread_mutex_unlock(&mig_lock);
    return NVML_SUCCESS;
}

/* NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE: the compute slices of each compute instance profile. */
static const unsigned ci_profile_slices[] = {1, 2, 3, 4, 7, 8, 6};
#define CI_PROFILES (sizeof ci_profile_slices / sizeof ci_profile_slices[0])

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *instance, unsigned profile, unsigned eng_profile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    GUARD;
    pthread_mutex_lock(&mig_lock);
    struct gi *g = as_gi(instance);
    struct profile *p = g ? find_profile(g->gpu, 0, g->profile_id) : NULL;
    nvmlReturn_t ret = !state.initialized ? NVML_ERROR_UNINITIALIZED
                       : !g || !p || !info || info->version != ((unsigned)sizeof *info | 2u << 24) || eng_profile != 0
                           ? NVML_ERROR_INVALID_ARGUMENT
                       : profile >= CI_PROFILES || ci_profile_slices[profile] > p->slices ? NVML_ERROR_NOT_SUPPORTED
                                                                                          : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) {
        unsigned slices = ci_profile_slices[profile];
        *info = (nvmlComputeInstanceProfileInfo_v2_t){info->version, profile, slices, p->slices / slices,
                                                      p->sm * slices / p->slices, p->ce, p->dec, p->enc, p->jpeg,
                                                      p->ofa, {0}};
        snprintf(info->name, sizeof info->name, "MIG %uc.%.80s", slices, p->name);
    }
    pthread_mutex_unlock(&mig_lock);
    return ret;
}

static nvmlReturn_t create_ci(struct gi *g, unsigned profile_id, void **compute) {
    struct profile *p = find_profile(g->gpu, 0, g->profile_id);
    if (!p || profile_id >= CI_PROFILES || ci_profile_slices[profile_id] > p->slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned slices = ci_profile_slices[profile_id], used = 0;
    int used_ids[MAX_CIS_PER_GI] = {0};
    for (int i = 0; i < state.ncis; i++)
        if (state.cis[i].alive && state.cis[i].gi == g->tag.index) {
            used += state.cis[i].size;
            if (state.cis[i].id < MAX_CIS_PER_GI)
                used_ids[state.cis[i].id] = 1;
        }
    unsigned id = 0;
    while (id < MAX_CIS_PER_GI && used_ids[id])
        id++;
    if (used + slices > p->slices || id == MAX_CIS_PER_GI)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    struct ci *c = add_ci(g->tag.index);
    if (!c)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned hash = 2166136261u;
    for (const char *k = state.gpus[g->gpu].uuid; *k; k++)
        hash = (hash ^ (unsigned char)*k) * 16777619u;
    unsigned serial = ++state.serial;
    snprintf(c->uuid, sizeof c->uuid, "MIG-%08x-%04x-4%03x-8%03x-%012x", hash, g->id, c->gi & 0xfff, id, serial);
    c->id = id;
    c->start = used;
    c->size = slices;
    c->gi_slices = p->slices;
    c->ci_slices = slices;
    c->sm = p->sm * slices / p->slices;
    c->ce = p->ce;
    c->dec = p->dec;
    c->enc = p->enc;
    c->jpeg = p->jpeg;
    c->ofa = p->ofa;
    c->memory_mb = p->memory_mb;
    *compute = &c->ci_tag;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *instance, unsigned profile_id, void **compute) {
    GUARD;
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&mig_lock);
    struct gi *g = as_gi(instance);
    int gpu = g ? g->gpu : -1;
    pthread_mutex_unlock(&mig_lock);
    if (!g || !compute)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = injected("nvmlGpuInstanceCreateComputeInstance", gpu);
    if (ret == NVML_SUCCESS)
        ret = begin_reconfiguration("nvmlGpuInstanceCreateComputeInstance", gpu);
    if (ret != NVML_SUCCESS)
        return ret;
    return end_reconfiguration(gpu, as_gi(instance) ? create_ci(g, profile_id, compute) : NVML_ERROR_INVALID_ARGUMENT);
}

nvmlReturn_t nvmlComputeInstanceDestroy(void *compute) {
    GUARD;
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&mig_lock);
    struct ci *c = as_ci(compute, KIND_CI);
    int gpu = c ? state.gis[c->gi].gpu : -1;
    pthread_mutex_unlock(&mig_lock);
    if (!c)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = injected("nvmlComputeInstanceDestroy", gpu);
    if (ret == NVML_SUCCESS)
        ret = begin_reconfiguration("nvmlComputeInstanceDestroy", gpu);
    if (ret != NVML_SUCCESS)
        return ret;
    if (as_ci(compute, KIND_CI))
        c->alive = 0;
    else
        ret = NVML_ERROR_INVALID_ARGUMENT;
    return end_reconfiguration(gpu, ret);
}

nvmlReturn_t nvmlGpuInstanceDestroy(void *instance) {
    GUARD;
    if (!state.initialized)
        return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&mig_lock);
    struct gi *g = as_gi(instance);
    int gpu = g ? g->gpu : -1;
    pthread_mutex_unlock(&mig_lock);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = injected("nvmlGpuInstanceDestroy", gpu);
    if (ret == NVML_SUCCESS)
        ret = begin_reconfiguration("nvmlGpuInstanceDestroy", gpu);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!as_gi(instance))
        return end_reconfiguration(gpu, NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < state.ncis; i++)
        if (state.cis[i].alive && state.cis[i].gi == g->tag.index)
            return end_reconfiguration(gpu, NVML_ERROR_IN_USE);
    g->alive = 0;
    return end_reconfiguration(gpu, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    GUARD;
    if (driver_unloaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
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
#ifdef FAKE_NVML_TELEMETRY_CALLS
    for (int i = 0; i < state.ncis; i++) /* MIG devices too, as NVML since R470 */
        if (state.cis[i].alive && !strcmp(state.cis[i].uuid, uuid)) {
            if (state.gpus[state.gis[state.cis[i].gi].gpu].lost)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &state.cis[i].tag;
            return NVML_SUCCESS;
        }
#endif
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, unsigned sensor, unsigned *temperature) {
    GUARD;
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
    GUARD;
    ENTER("nvmlDeviceGetTotalEccErrors", device);
    struct gpu *g = as_gpu(device);
    if (!g || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = error_type == 1 && counter_type == 0 ? g->ecc_uncorrected : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned *corrected, unsigned *uncorrected, unsigned *pending,
                                       unsigned *failure) {
    GUARD;
    ENTER("nvmlDeviceGetRemappedRows", device);
    struct gpu *g = as_gpu(device);
    if (!g || !corrected || !uncorrected || !pending || !failure)
        return NVML_ERROR_INVALID_ARGUMENT;
    *corrected = *uncorrected = 0;
    *pending = g->remap_pending;
    *failure = g->remap_failure;
    return NVML_SUCCESS;
}

/* Only the GPU recovery action; every other field is not supported. */
nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    GUARD;
    ENTER("nvmlDeviceGetFieldValues", device);
    struct gpu *g = as_gpu(device);
    if (!g || count <= 0 || !values)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        if (v->fieldId != FI_DEV_GET_GPU_RECOVERY_ACTION || g->recovery < 0) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned)g->recovery;
    }
    return NVML_SUCCESS;
}

static int g_mig_capable(void *device) {
    struct gpu *g = as_gpu(device);
    return g && g->mig_mode >= 0;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    GUARD;
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
    GUARD;
    if (driver_unloaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
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
    GUARD;
    if (!as_event_set(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    close_event_set();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    GUARD;
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
    else if (!strcmp(verb, "recovery") && n == 3)
        g->recovery = (int)a[1];
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
    GUARD;
    if (driver_unloaded())
        return NVML_ERROR_DRIVER_NOT_LOADED;
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
        /* The only call that blocks: other threads' calls go on while it waits. */
        pthread_mutex_unlock(&nvml_lock);
        int ready = poll(&p, event_set.fd >= 0 ? 1 : 0, (int)left);
        pthread_mutex_lock(&nvml_lock);
        if (ready < 0 && errno != EINTR)
            return NVML_ERROR_UNKNOWN;
        if (ready > 0) {
            if (event_set.len >= sizeof event_set.buf)
                event_set.len = 0; /* a line longer than the buffer: drop it rather than spin */
            size_t room = sizeof event_set.buf - event_set.len;
            /* GCC 13's fortified read() takes the bound for 4128 bytes and more: a false alarm. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
            ssize_t got = read(event_set.fd, &event_set.buf[event_set.len], room);
#pragma GCC diagnostic pop
            if (got > 0)
                event_set.len += (size_t)got;
        }
    }
}

/* --- telemetry (FAKE_NVML_TELEMETRY) ----------------------------------------------------------- */
#ifdef FAKE_NVML_TELEMETRY_CALLS

#define MAX_PROCS 64
#define MAX_NVLINKS 18

struct proc_info {
    int gpu;
    unsigned pid;
    unsigned long long used;
    int sm;
};

/* One GPU's figures. */
struct figures {
    unsigned sm, mem, power, sm_clock, mem_clock, nvlinks, nvlink_up;
    unsigned long long reasons, used;
    int used_set;
};

static struct {
    struct timespec mtime;
    off_t size;
    struct figures gpus[MAX_GPUS];
    struct proc_info procs[MAX_PROCS];
    int nprocs;
} telemetry;

static pthread_mutex_t telemetry_lock = PTHREAD_MUTEX_INITIALIZER;

/* Read FAKE_NVML_TELEMETRY again if it changed since the last call; caller holds telemetry_lock. */
static void telemetry_refresh(void) {
    const char *path = getenv("FAKE_NVML_TELEMETRY");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        st.st_mtim = (struct timespec){0};
        st.st_size = -1;
    }
    if (st.st_mtim.tv_sec == telemetry.mtime.tv_sec && st.st_mtim.tv_nsec == telemetry.mtime.tv_nsec &&
        st.st_size == telemetry.size && telemetry.size != 0)
        return;
    memset(&telemetry, 0, sizeof telemetry);
    telemetry.mtime = st.st_mtim;
    telemetry.size = st.st_size;
    for (int i = 0; i < MAX_GPUS; i++)
        telemetry.gpus[i] = (struct figures){.power = 70000, .sm_clock = 1980, .mem_clock = 2619, .reasons = 1};
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file)
        return;
    char line[256], what[16];
    unsigned long long a, b, c;
    long long sm;
    while (fgets(line, sizeof line, file)) {
        int n = sscanf(line, "%15s %llu %llu %llu %lld", what, &a, &b, &c, &sm);
        if (n < 3 || a >= MAX_GPUS)
            continue;
        struct figures *f = &telemetry.gpus[a];
        if (!strcmp(what, "util") && n >= 4) {
            f->sm = (unsigned)b;
            f->mem = (unsigned)c;
            f->reasons = b ? 0 : 1;
        } else if (!strcmp(what, "power")) {
            f->power = (unsigned)b;
        } else if (!strcmp(what, "clocks") && n >= 4) {
            f->sm_clock = (unsigned)b;
            f->mem_clock = (unsigned)c;
        } else if (!strcmp(what, "reasons")) {
            f->reasons = b;
        } else if (!strcmp(what, "used")) {
            f->used = b;
            f->used_set = 1;
        } else if (!strcmp(what, "nvlink") && n >= 4) {
            f->nvlinks = b < MAX_NVLINKS ? (unsigned)b : MAX_NVLINKS;
            f->nvlink_up = (unsigned)c;
        } else if (!strcmp(what, "proc") && telemetry.nprocs < MAX_PROCS) {
            telemetry.procs[telemetry.nprocs++] = (struct proc_info){
                .gpu = (int)a, .pid = (unsigned)b, .used = n >= 4 ? c : 0, .sm = n >= 5 ? (int)sm : -1};
        }
    }
    fclose(file);
    for (int i = 0; i < telemetry.nprocs; i++)
        if (!telemetry.gpus[telemetry.procs[i].gpu].used_set)
            telemetry.gpus[telemetry.procs[i].gpu].used += telemetry.procs[i].used;
}

/* A full GPU's figures and processes as of now (NOT_SUPPORTED on a MIG device, as real NVML
 * answers its utilisation, power and clock calls). */
static nvmlReturn_t figures_of(void *device, struct figures *out, struct proc_info *procs, unsigned *nprocs) {
    struct gpu *g = as_gpu(device);
    if (!g)
        return as_ci(device, KIND_MIG) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&telemetry_lock);
    telemetry_refresh();
    *out = telemetry.gpus[g->tag.index];
    unsigned n = 0;
    for (int i = 0; procs && i < telemetry.nprocs; i++)
        if (telemetry.procs[i].gpu == g->tag.index)
            procs[n++] = telemetry.procs[i];
    if (nprocs)
        *nprocs = n;
    pthread_mutex_unlock(&telemetry_lock);
    return NVML_SUCCESS;
}

static unsigned long long telemetry_used(void *device) {
    struct figures f;
    return figures_of(device, &f, NULL, NULL) == NVML_SUCCESS ? f.used : 0;
}

typedef struct {
    unsigned gpu, memory;
} nvmlUtilization_t;

#define FIGURES(name, device)                                                                      \
    struct figures f;                                                                              \
    ENTER(name, device);                                                                           \
    nvmlReturn_t code_ = figures_of(device, &f, NULL, NULL);                                       \
    if (code_ != NVML_SUCCESS)                                                                     \
        return code_;

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *rates) {
    GUARD;
    FIGURES("nvmlDeviceGetUtilizationRates", device);
    *rates = (nvmlUtilization_t){f.sm, f.mem};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned *milliwatts) {
    GUARD;
    FIGURES("nvmlDeviceGetPowerUsage", device);
    *milliwatts = f.power;
    return NVML_SUCCESS;
}

/* NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 */
nvmlReturn_t nvmlDeviceGetClockInfo(void *device, unsigned type, unsigned *mhz) {
    GUARD;
    FIGURES("nvmlDeviceGetClockInfo", device);
    if (type != 1 && type != 2)
        return NVML_ERROR_NOT_SUPPORTED;
    *mhz = type == 1 ? f.sm_clock : f.mem_clock;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *reasons) {
    GUARD;
    FIGURES("nvmlDeviceGetCurrentClocksEventReasons", device);
    *reasons = f.reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned link, unsigned *active) {
    GUARD;
    FIGURES("nvmlDeviceGetNvLinkState", device);
    if (link >= f.nvlinks)
        return f.nvlinks ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    *active = (f.nvlink_up >> link) & 1u;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned pid;
    unsigned long long used_gpu_memory;
    unsigned gpu_instance_id, compute_instance_id;
} nvmlProcessInfo_t;

/* NVML's two-call protocol for lists: too small a buffer gets INSUFFICIENT_SIZE and the count. */
static nvmlReturn_t listed(unsigned n, unsigned *count, int have_buffer) {
    nvmlReturn_t code = n == 0 || (have_buffer && n <= *count) ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    *count = n;
    return code;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count, nvmlProcessInfo_t *infos) {
    GUARD;
    ENTER("nvmlDeviceGetComputeRunningProcesses_v3", device);
    if (as_ci(device, KIND_MIG))
        return listed(0, count, 1);
    struct figures f;
    struct proc_info procs[MAX_PROCS];
    unsigned n;
    nvmlReturn_t code = figures_of(device, &f, procs, &n);
    if (code != NVML_SUCCESS)
        return code;
    for (unsigned i = 0; infos && i < n && i < *count; i++)
        infos[i] = (nvmlProcessInfo_t){procs[i].pid, procs[i].used, WHOLE_GPU, WHOLE_GPU};
    return listed(n, count, infos != NULL);
}

typedef struct {
    unsigned pid;
    unsigned long long time_stamp;
    unsigned sm_util, mem_util, enc_util, dec_util;
} nvmlProcessUtilizationSample_t;

/* Every process with an SM figure gives one sample, stamped now (NOT_FOUND: none). */
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device, nvmlProcessUtilizationSample_t *samples, unsigned *count,
                                             unsigned long long since) {
    GUARD;
    ENTER("nvmlDeviceGetProcessUtilization", device);
    (void)since;
    struct figures f;
    struct proc_info procs[MAX_PROCS];
    unsigned n, sampled = 0;
    nvmlReturn_t code = figures_of(device, &f, procs, &n);
    if (code != NVML_SUCCESS)
        return code;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long stamp = (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000;
    for (unsigned i = 0; i < n; i++)
        if (procs[i].sm >= 0) {
            if (samples && sampled < *count)
                samples[sampled] = (nvmlProcessUtilizationSample_t){procs[i].pid, stamp, (unsigned)procs[i].sm, 0, 0, 0};
            sampled++;
        }
    if (sampled == 0)
        return NVML_ERROR_NOT_FOUND;
    return listed(sampled, count, samples != NULL);
}
#endif /* FAKE_NVML_TELEMETRY_CALLS */
