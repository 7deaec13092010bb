/* Shift a process's wall clock by the number of milliseconds written in $CLOCK_SHIFT_FILE.
 *
 * For tests that step the wall clock of a running redis-server. libfaketime 0.9.10 (Debian 12)
 * cannot start Debian's redis-server: jemalloc's initialisation calls clock_gettime inside
 * libfaketime's own start-up ("Unexpected recursive calls to clock_gettime()"). This shim never
 * allocates and never calls dlsym: it asks the kernel directly (syscall), so it cannot recurse.
 * Only CLOCK_REALTIME* (and gettimeofday, time) move; monotonic clocks stay honest, as on a host
 * whose NTP steps the clock. The file is re-read at most every 100 ms of monotonic time.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long long shift_ns = 0;
static volatile long long checked_at_ns = -1;

static long long monotonic_ns(void) {
  struct timespec t;
  syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void refresh(void) {
  const char *path = getenv("CLOCK_SHIFT_FILE");
  if (path == NULL) return;
  long long now = monotonic_ns();
  if (checked_at_ns >= 0 && now - checked_at_ns < 100000000LL) return;
  checked_at_ns = now;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  char buf[32];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return;
  buf[n] = 0;
  shift_ns = strtoll(buf, NULL, 10) * 1000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  int rc = (int)syscall(SYS_clock_gettime, id, ts);
  if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    refresh();
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
  }
  return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (tv != NULL) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return 0;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out != NULL) *out = ts.tv_sec;
  return ts.tv_sec;
}
