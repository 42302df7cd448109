/*
 * A stand-in nvidia-smi that is an ELF binary, as the real one is: it runs in an image with no
 * shell. `nvidia-smi -L` lists what the libcuda.so.1 the dynamic loader finds (by SONAME, as the
 * image's loader resolves it) sees, in the real tool's format:
 *
 *   GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
 *
 * exiting 9 when the driver cannot be reached (libcuda missing, cuInit failing) and 6 when no
 * device is visible, as nvidia-smi does. Any other argument list is appended, one line per call,
 * to $FAKE_NVIDIA_SMI_LOG (default /tmp/nvidia-smi.calls) and succeeds: what the plugin runs for
 * time slicing (`compute-policy --set-timeslice=N -i UUID`).
 *
 * Build: cc -o nvidia-smi fake_nvidia_smi.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(unsigned int);
typedef int (*count_fn)(int *);
typedef int (*get_fn)(int *, int);
typedef int (*name_fn)(char *, int, int);

static int list_devices(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: %s\n", dlerror());
        return 9;
    }
    init_fn init = (init_fn)dlsym(cuda, "cuInit");
    count_fn count = (count_fn)dlsym(cuda, "cuDeviceGetCount");
    get_fn get = (get_fn)dlsym(cuda, "cuDeviceGet");
    name_fn name = (name_fn)dlsym(cuda, "cuDeviceGetName");
    name_fn uuid = (name_fn)dlsym(cuda, "fakeCudaDeviceUuidString");
    int n = 0, rc;
    if (!init || !count || !get || !name || !uuid || (rc = init(0)) != 0 || count(&n) != 0) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
        return 9;
    }
    if (n == 0) {
        printf("No devices were found\n");
        return 6;
    }
    for (int i = 0; i < n; i++) {
        int device;
        char device_name[96], device_uuid[64];
        if (get(&device, i) != 0 || name(device_name, sizeof device_name, device) != 0 ||
            uuid(device_uuid, sizeof device_uuid, device) != 0)
            return 9;
        printf("GPU %d: %s (UUID: %s)\n", i, device_name, device_uuid);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "-L") == 0) return list_devices();
    const char *path = getenv("FAKE_NVIDIA_SMI_LOG");
    FILE *log = fopen(path && *path ? path : "/tmp/nvidia-smi.calls", "a");
    if (log == NULL) return 0;
    for (int i = 1; i < argc; i++) fprintf(log, "%s%s", argv[i], i + 1 < argc ? " " : "");
    fputc('\n', log);
    fclose(log);
    return 0;
}
