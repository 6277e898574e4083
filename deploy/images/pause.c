/* pause: the first process of every Pod on the test node (containerd's sandbox image).
 *
 * It holds the Pod's namespaces open while the Pod's containers come and go. As PID 1 of the
 * Pod's PID namespace (when shared) it reaps orphans; SIGINT and SIGTERM end it at once, since
 * it has nothing to flush. Built static by sandpod_image.nodeimages (gcc from Debian), so its
 * image is this one file on scratch. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
	(void)sig;
	_exit(0);
}

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	(void)argv;
	if (argc > 1) {
		fputs("pause: takes no arguments\n", stderr);
		return 2;
	}
	struct sigaction on_stop = {.sa_handler = stop};
	struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
	if (sigaction(SIGINT, &on_stop, NULL) || sigaction(SIGTERM, &on_stop, NULL) ||
	    sigaction(SIGCHLD, &on_child, NULL)) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;)
		pause();
}
