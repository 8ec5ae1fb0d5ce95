/*
 * A power cut for one process, as an LD_PRELOAD library (tests/test_relay_crash.py builds it).
 *
 * A host that loses power keeps of a file only what was fsynced; a process killed with SIGKILL
 * keeps everything it wrote, because the kernel's page cache outlives it. To test what a host
 * crash loses without crashing a host, this library holds the bytes written to a Redis/Valkey
 * append-only file (a path ending in ".incr.aof") in the process's own memory until the file is
 * fsynced: SIGKILL then loses exactly what a power cut would. Every other file, socket and pipe is
 * written through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FDS 65536

struct held {
    int tracked;
    char *data;
    size_t length, capacity;
};

static struct held files[MAX_FDS];
static pthread_mutex_t guard = PTHREAD_MUTEX_INITIALIZER; /* the fsync runs in a thread of its own */

static ssize_t (*real_write)(int, const void *, size_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_close)(int);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);

__attribute__((constructor)) static void resolve(void) {
    real_write = dlsym(RTLD_NEXT, "write");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_close = dlsym(RTLD_NEXT, "close");
    real_open = dlsym(RTLD_NEXT, "open");
    real_open64 = dlsym(RTLD_NEXT, "open64");
    real_openat = dlsym(RTLD_NEXT, "openat");
}

static int in_range(int fd) { return fd >= 0 && fd < MAX_FDS; }

static void opened(int fd, const char *path) {
    if (!in_range(fd)) return;
    size_t n = path ? strlen(path) : 0;
    pthread_mutex_lock(&guard);
    files[fd].tracked = n >= 9 && strcmp(path + n - 9, ".incr.aof") == 0;
    files[fd].length = 0;
    pthread_mutex_unlock(&guard);
}

/* Write what is held to the file itself; called with the guard held. */
static int release(int fd) {
    struct held *file = &files[fd];
    size_t done = 0;
    while (done < file->length) {
        ssize_t n = real_write(fd, file->data + done, file->length - done);
        if (n < 0) return -1;
        done += (size_t)n;
    }
    file->length = 0;
    return 0;
}

static mode_t mode_of(int flags, va_list args) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(args, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = real_open(path, flags, mode);
    opened(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = real_open64(path, flags, mode);
    opened(fd, path);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = real_openat(dirfd, path, flags, mode);
    opened(fd, path);
    return fd;
}

ssize_t write(int fd, const void *buffer, size_t count) {
    if (in_range(fd)) {
        pthread_mutex_lock(&guard);
        struct held *file = &files[fd];
        if (file->tracked) {
            if (file->length + count > file->capacity) {
                size_t capacity = (file->length + count) * 2;
                char *data = realloc(file->data, capacity);
                if (data == NULL) {
                    pthread_mutex_unlock(&guard);
                    return -1;
                }
                file->data = data;
                file->capacity = capacity;
            }
            memcpy(file->data + file->length, buffer, count);
            file->length += count;
            pthread_mutex_unlock(&guard);
            return (ssize_t)count; /* "written": in the page cache, as far as the caller can tell */
        }
        pthread_mutex_unlock(&guard);
    }
    return real_write(fd, buffer, count);
}

static int synced(int fd, int (*sync)(int)) {
    if (in_range(fd)) {
        pthread_mutex_lock(&guard);
        int failed = files[fd].tracked ? release(fd) : 0;
        pthread_mutex_unlock(&guard);
        if (failed) return -1;
    }
    return sync(fd);
}

int fsync(int fd) { return synced(fd, real_fsync); }

int fdatasync(int fd) { return synced(fd, real_fdatasync); }

int close(int fd) {
    if (in_range(fd)) {
        pthread_mutex_lock(&guard);
        if (files[fd].tracked) release(fd); /* closed, not crashed: the kernel would keep it */
        files[fd].tracked = 0;
        pthread_mutex_unlock(&guard);
    }
    return real_close(fd);
}
