/*
 * A fake libcuda.so.1: what a CUDA program calls first, answering from the device nodes the
 * process can open, as the real one answers from the GPUs the kernel driver lets it open.
 *
 * The node's GPUs are described in a table appended to this very file, after the line
 * "#fake-cuda-gpus" (the dynamic loader maps only what the ELF headers name, so the table rides
 * along wherever the file is bind-mounted; tests/fakenvml/cuda.py appends it). Lines, fields
 * separated by one TAB:
 *
 *   gpu   NODE UUID NAME MEMORY_BYTES                 a whole GPU, usable through /dev/nvidiaN
 *   mig   NODE GI_NODE CI_NODE UUID NAME MEMORY_BYTES  a MIG device: its parent's node and the
 *                                                     two nvidia-caps access nodes
 *
 * A device is visible when every node it names can be opened, or when opening fails with ENXIO /
 * ENODEV: the node exists and the device cgroup let the open through, but no kernel driver sits
 * behind the major (a machine without NVIDIA hardware). EPERM (the cgroup refused) or ENOENT
 * (the node is not in this container) hide it. cuInit also needs /dev/nvidiactl and
 * /dev/nvidia-uvm, as the real one does.
 *
 * MPS: with CUDA_MPS_PIPE_DIRECTORY set, cuInit connects to `<dir>/control` (the MPS stand-in,
 * dradriver.backend.fake.mps_standin, speaks the lines used here) and reads the default active thread
 * percentage and each device's pinned memory limit, which a context then reports through
 * cuCtxGetExecAffinity (every fake GPU has 100 SMs, so the count is the percentage) and
 * cuMemGetInfo; cuMemAlloc fails beyond the limit.
 *
 * Build: cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 fake_cuda.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct {
    char bytes[16];
} CUuuid;
typedef struct {
    int type;
    unsigned int sm_count;
} CUexecAffinityParam;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_UNKNOWN = 999,
};

#define MARKER "\n#fake-cuda-gpus\n"
#define MAX_DEVICES 64
#define FAKE_SMS 100

struct device {
    char uuid[64];
    char name[96];
    unsigned long long memory;
    unsigned long long limit; /* MPS pinned memory limit, else memory */
    unsigned long long used;
};

struct context {
    int device;
};

static struct device devices[MAX_DEVICES];
static int device_count;
static int initialized;
static int thread_percentage = 100;
static struct context contexts[MAX_DEVICES];
static struct context *current;

/* Whether this process may use the node: opened, or refused only for want of a kernel driver. */
static int can_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno == ENXIO || errno == ENODEV;
}

static char *read_table(void) {
    Dl_info info;
    if (!dladdr((void *)read_table, &info) || info.dli_fname == NULL) return NULL;
    FILE *file = fopen(info.dli_fname, "rb");
    if (file == NULL) return NULL;
    size_t size = 0, capacity = 1 << 16;
    char *data = malloc(capacity + 1);
    size_t got;
    while (data != NULL && (got = fread(data + size, 1, capacity - size, file)) > 0) {
        size += got;
        if (size == capacity) {
            capacity *= 2;
            data = realloc(data, capacity + 1);
        }
    }
    fclose(file);
    if (data == NULL) return NULL;
    data[size] = 0;
    /* The last marker: the first is this very string in the library's read-only data. */
    char *table = NULL;
    for (char *at = data; (at = memmem(at, size - (size_t)(at - data), MARKER, strlen(MARKER))); at++)
        table = at;
    char *copy = table ? strdup(table + strlen(MARKER)) : NULL;
    free(data);
    return copy;
}

static void add_device(const char *uuid, const char *name, const char *memory) {
    if (device_count == MAX_DEVICES) return;
    struct device *d = &devices[device_count++];
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->memory = d->limit = strtoull(memory, NULL, 10);
}

static void load_devices(char *table) {
    char *save = NULL;
    for (char *line = strtok_r(table, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *field[8];
        int n = 0;
        for (char *f = strtok(line, "\t"); f && n < 8; f = strtok(NULL, "\t")) field[n++] = f;
        if (n == 5 && strcmp(field[0], "gpu") == 0 && can_open(field[1]))
            add_device(field[2], field[3], field[4]);
        else if (n == 7 && strcmp(field[0], "mig") == 0 && can_open(field[1]) && can_open(field[2]) &&
                 can_open(field[3]))
            add_device(field[4], field[5], field[6]);
    }
}

/* One request line to the MPS control daemon, its reply line into `reply`. */
static int mps_ask(int fd, const char *request, char *reply, size_t size) {
    if (write(fd, request, strlen(request)) != (ssize_t)strlen(request)) return -1;
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t got = read(fd, reply + n, 1);
        if (got <= 0) return -1;
        if (reply[n] == '\n') break;
        n++;
    }
    reply[n] = 0;
    return 0;
}

static CUresult connect_mps(const char *pipe_dir) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (snprintf(address.sun_path, sizeof address.sun_path, "%s/control", pipe_dir) >=
        (int)sizeof address.sun_path)
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    char reply[128], request[128];
    CUresult rc = CUDA_ERROR_MPS_CONNECTION_FAILED;
    if (mps_ask(fd, "get_default_active_thread_percentage\n", reply, sizeof reply) == 0) {
        thread_percentage = atoi(reply);
        rc = CUDA_SUCCESS;
        for (int i = 0; i < device_count && rc == CUDA_SUCCESS; i++) {
            snprintf(request, sizeof request, "get_default_device_pinned_mem_limit %.63s\n", devices[i].uuid);
            if (mps_ask(fd, request, reply, sizeof reply) != 0) {
                rc = CUDA_ERROR_MPS_CONNECTION_FAILED;
            } else if (strcmp(reply, "none") != 0) {
                unsigned long long value = strtoull(reply, NULL, 10);
                devices[i].limit = value << (strchr(reply, 'G') ? 30 : 20);
            }
        }
    }
    close(fd);
    return rc;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (initialized) return CUDA_SUCCESS;
    if (!can_open("/dev/nvidiactl") || !can_open("/dev/nvidia-uvm")) return CUDA_ERROR_UNKNOWN;
    char *table = read_table();
    if (table == NULL) return CUDA_ERROR_UNKNOWN;
    load_devices(table);
    free(table);
    if (device_count == 0) return CUDA_ERROR_NO_DEVICE;
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (pipe_dir != NULL && *pipe_dir) {
        CUresult rc = connect_mps(pipe_dir);
        if (rc != CUDA_SUCCESS) return rc;
    }
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = 12080;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult check_device(CUdevice device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return device < 0 || device >= device_count ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

/* One of a device's strings into the caller's buffer. */
static CUresult copy_out(char *out, int length, CUdevice device, int uuid) {
    CUresult rc = check_device(device);
    if (rc != CUDA_SUCCESS) return rc;
    if (out == NULL || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(out, (size_t)length, "%s", uuid ? devices[device].uuid : devices[device].name);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) { return copy_out(name, length, device, 0); }

/* The 16 bytes of "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (or MIG-...). */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    CUresult rc = check_device(device);
    if (rc != CUDA_SUCCESS) return rc;
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    const char *hex = strchr(devices[device].uuid, '-');
    int n = 0;
    for (const char *p = hex ? hex + 1 : ""; *p && n < 32; p++) {
        if (*p == '-') continue;
        char digit[2] = {*p, 0};
        unsigned value = (unsigned)strtoul(digit, NULL, 16);
        uuid->bytes[n / 2] = (char)(n % 2 ? (uuid->bytes[n / 2] | (char)value) : (char)(value << 4));
        n++;
    }
    return n == 32 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) { return cuDeviceGetUuid_v2(uuid, device); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    CUresult rc = check_device(device);
    if (rc != CUDA_SUCCESS) return rc;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    *bytes = devices[device].memory;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(struct context **context, unsigned int flags, CUdevice device) {
    (void)flags;
    CUresult rc = check_device(device);
    if (rc != CUDA_SUCCESS) return rc;
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    contexts[device].device = device;
    *context = current = &contexts[device];
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(struct context **context, unsigned int flags, CUdevice device) {
    return cuCtxCreate_v2(context, flags, device);
}

CUresult cuCtxDestroy_v2(struct context *context) {
    if (context == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    if (current == context) current = NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetExecAffinity(CUexecAffinityParam *affinity, int type) {
    if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    if (affinity == NULL || type != 0) return CUDA_ERROR_INVALID_VALUE;
    affinity->type = 0;
    affinity->sm_count = FAKE_SMS * (unsigned)thread_percentage / 100;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    struct device *d = &devices[current->device];
    if (free_bytes != NULL) *free_bytes = d->limit - d->used;
    if (total != NULL) *total = d->limit;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    if (pointer == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    struct device *d = &devices[current->device];
    if (bytes > d->limit - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
    *pointer = 0x7f0000000000ULL + d->used;
    d->used += bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *pointer, size_t bytes) { return cuMemAlloc_v2(pointer, bytes); }

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    (void)pointer; /* a bump allocator: freeing returns nothing */
    return current == NULL ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_MPS_CONNECTION_FAILED: *text = "MPS client failed to connect to the MPS control daemon"; break;
    default: *text = "unknown error"; break;
    }
    return CUDA_SUCCESS;
}

/* Not CUDA's: the device's UUID as the table spells it (GPU-... or MIG-...), for the stand-in
 * nvidia-smi, which the real one gets from NVML. */
CUresult fakeCudaDeviceUuidString(char *out, int length, CUdevice device) {
    return copy_out(out, length, device, 1);
}
