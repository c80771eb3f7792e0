/* The test session's processes are launched with this library preloaded (tests/conftest.py builds it): MPICH's
 * ranks wait for their peers by spinning on sched_yield, a full core each on the 2-core test machine, where the
 * suite runs several jobs at once. A thread that has yielded more than SPIN_YIELDS times in a row, each within
 * STREAK_NS of the last (one wait, milliseconds long), sleeps SLEEP_NS at each yield after: a short wait stays a
 * spin, a long one costs a few percent of a core and answers its peer within SLEEP_NS. */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { SPIN_YIELDS = 1000 };
static const long STREAK_NS = 100000, SLEEP_NS = 50000;
static __thread long streak;
static __thread struct timespec last;

static long since(const struct timespec *then, const struct timespec *now) {
    return (now->tv_sec - then->tv_sec) * 1000000000L + (now->tv_nsec - then->tv_nsec);
}

int sched_yield(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    streak = since(&last, &now) > STREAK_NS ? 1 : streak + 1;
    if (streak > SPIN_YIELDS) {
        struct timespec nap = {0, SLEEP_NS};
        nanosleep(&nap, 0);
        clock_gettime(CLOCK_MONOTONIC, &now);
        last = now;
        return 0;
    }
    last = now;
    return (int)syscall(SYS_sched_yield);
}
