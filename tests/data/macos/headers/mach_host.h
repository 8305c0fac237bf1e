/* Declarations from <mach/host_info.h>, <mach/machine.h> (xnu osfmk/mach/), the MIG-generated
   <mach/mach_host.h>, <mach/mach_init.h> and <mach/mach_time.h>. */
typedef integer_t *host_info_t;
typedef integer_t host_flavor_t;
#define HOST_CPU_LOAD_INFO 3
#define CPU_STATE_MAX 4
#define CPU_STATE_USER 0
#define CPU_STATE_SYSTEM 1
#define CPU_STATE_IDLE 2
#define CPU_STATE_NICE 3
struct host_cpu_load_info {
	natural_t cpu_ticks[CPU_STATE_MAX];
};
struct mach_timebase_info {
	uint32_t numer;
	uint32_t denom;
};
mach_port_t mach_host_self(void);
kern_return_t host_statistics(host_t host_priv, host_flavor_t flavor, host_info_t host_info_out, mach_msg_type_number_t *host_info_outCnt);
kern_return_t mach_timebase_info(mach_timebase_info_t info);
