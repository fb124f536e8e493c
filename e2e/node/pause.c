/* The test node's sandbox process ("pause"): sleeps as PID 1 of each pod, reaps orphans,
 * exits on SIGINT or SIGTERM. Built statically by build.sh into the pause image. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) { (void)signo; _exit(0); }
static void reap(int signo) { (void)signo; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction down = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &down, NULL);
  sigaction(SIGTERM, &down, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
