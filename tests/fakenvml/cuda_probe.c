/*
 * What a CUDA application in a container sees: it loads libcuda.so.1 by SONAME (the image's
 * dynamic loader decides from where), initialises CUDA, lists each device's UUID, makes a context
 * on it and allocates memory there, then runs `nvidia-smi -L` from PATH with no shell. Output,
 * one fact per line:
 *
 *   libcuda PATH                    the file the loader picked
 *   ld-library-path VALUE           the process's LD_LIBRARY_PATH ("-" when unset)
 *   needed SONAME PATH              for each `--need SONAME` argument: a library of the image's
 *                                   own, loaded before CUDA (its LD_LIBRARY_PATH must still work)
 *   device N UUID SMS MEMORY NAME   UUID as 8-4-4-4-12 hex (no GPU-/MIG- prefix: CUDA has none)
 *   (nvidia-smi -L's own output)
 *   nvidia-smi exit CODE
 *   probe ok                        only when every step worked (exit 0; else exit 1)
 *
 * With `--stay` it then waits for SIGTERM (exit status as above), so that a pod stays Running.
 *
 * Build: cc -o cuda-probe cuda_probe.c   (dynamically linked: the image's own loader runs it)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int type;
    unsigned int sm_count;
} affinity_t;

static void *cuda;

static void *symbol(const char *name) {
    void *found = dlsym(cuda, name);
    if (found == NULL) {
        printf("error: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return found;
}

#define CALL(type, name, ...)                                                                     \
    do {                                                                                          \
        int rc_ = ((type)symbol(name))(__VA_ARGS__);                                              \
        if (rc_ != 0) {                                                                           \
            printf("error: %s returned %d\n", name, rc_);                                         \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static const char *loaded_from(void *handle) {
    struct link_map *map = NULL;
    return dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : "?";
}

static volatile sig_atomic_t stopped;

static void on_term(int signal_number) {
    (void)signal_number;
    stopped = 1;
}

static int probe(int argc, char **argv) {
    const char *path = getenv("LD_LIBRARY_PATH");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--need") != 0) continue;
        void *own = dlopen(argv[i + 1], RTLD_NOW);
        if (own == NULL) {
            printf("error: %s\n", dlerror());
            return 1;
        }
        printf("needed %s %s\n", argv[i + 1], loaded_from(own));
    }
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) {
        printf("error: %s\n", dlerror());
        return 1;
    }
    printf("libcuda %s\nld-library-path %s\n", loaded_from(cuda), path ? path : "-");
    CALL(int (*)(unsigned), "cuInit", 0);
    int count = 0;
    CALL(int (*)(int *), "cuDeviceGetCount", &count);
    for (int ordinal = 0; ordinal < count; ordinal++) {
        int device;
        char name[96];
        unsigned char u[16];
        void *context;
        unsigned long long pointer;
        affinity_t affinity;
        size_t free_bytes, total;
        CALL(int (*)(int *, int), "cuDeviceGet", &device, ordinal);
        CALL(int (*)(char *, int, int), "cuDeviceGetName", name, (int)sizeof name, device);
        CALL(int (*)(unsigned char *, int), "cuDeviceGetUuid_v2", u, device);
        CALL(int (*)(void **, unsigned, int), "cuCtxCreate_v2", &context, 0, device);
        CALL(int (*)(unsigned long long *, size_t), "cuMemAlloc_v2", &pointer, (size_t)1 << 20);
        CALL(int (*)(affinity_t *, int), "cuCtxGetExecAffinity", &affinity, 0);
        CALL(int (*)(size_t *, size_t *), "cuMemGetInfo_v2", &free_bytes, &total);
        CALL(int (*)(unsigned long long), "cuMemFree_v2", pointer);
        CALL(int (*)(void *), "cuCtxDestroy_v2", context);
        printf("device %d %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x %u %zu %s\n",
               ordinal, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
               u[13], u[14], u[15], affinity.sm_count, total, name);
    }
    pid_t child = fork();
    if (child == 0) {
        char *smi[] = {"nvidia-smi", "-L", NULL};
        execvp(smi[0], smi);
        printf("error: nvidia-smi: cannot run it from PATH\n");
        _exit(127);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child) return 1;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    printf("nvidia-smi exit %d\n", code);
    if (code != 0) return 1;
    printf("probe ok\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int stay = 0;
    for (int i = 1; i < argc; i++) stay |= strcmp(argv[i], "--stay") == 0;
    sigset_t term, unblocked;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (stay) { /* blocked until sigsuspend waits for it: none is lost in between */
        signal(SIGTERM, on_term);
        sigprocmask(SIG_BLOCK, &term, &unblocked);
    }
    int code = probe(argc, argv);
    while (stay && !stopped) sigsuspend(&unblocked);
    return code;
}
