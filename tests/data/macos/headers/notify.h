/* Declarations from <notify.h> (Libnotify, libSystem), as printed in notify(3)'s SYNOPSIS. */
#define NOTIFY_STATUS_OK 0
uint32_t notify_register_check(const char *name, int *out_token);
uint32_t notify_get_state(int token, uint64_t *state);
uint32_t notify_cancel(int token);
