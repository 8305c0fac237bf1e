/* Declaration from <libproc.h> (xnu libsyscall/wrappers/libproc/libproc.h). */
int proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer);
