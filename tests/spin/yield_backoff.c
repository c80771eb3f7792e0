/* The test session's processes are launched with this library preloaded (tests/conftest.py builds it): MPICH's
 * ranks wait for their peers by spinning on sched_yield, a full core each on the 2-core test machine, where the
 * suite runs several jobs at once. A thread that has yielded more than SPIN_YIELDS times in a row, each within
 * STREAK_NS of the last (one wait), sleeps at each yield after: an eighth of the wait so far, between MIN_SLEEP_NS
 * and MAX_SLEEP_NS. A short wait stays a spin; a long one (a peer importing torch for seconds) costs a few wake-ups
 * a millisecond, not twenty, and ends at most an eighth later than its peer's answer (1 ms at most). */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { SPIN_YIELDS = 200 };
static const long STREAK_NS = 100000, MIN_SLEEP_NS = 50000, MAX_SLEEP_NS = 1000000;
static __thread long streak;
static __thread struct timespec last, begun;

static long since(const struct timespec *then, const struct timespec *now) {
    return (now->tv_sec - then->tv_sec) * 1000000000L + (now->tv_nsec - then->tv_nsec);
}

int sched_yield(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (since(&last, &now) > STREAK_NS) {
        streak = 1;
        begun = now;
    } else {
        streak += 1;
    }
    if (streak > SPIN_YIELDS) {
        long ns = since(&begun, &now) / 8;
        struct timespec nap = {0, ns < MIN_SLEEP_NS ? MIN_SLEEP_NS : ns > MAX_SLEEP_NS ? MAX_SLEEP_NS : ns};
        nanosleep(&nap, 0);
        clock_gettime(CLOCK_MONOTONIC, &now);
        last = now;
        return 0;
    }
    last = now;
    return (int)syscall(SYS_sched_yield);
}
