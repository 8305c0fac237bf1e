/* Declarations from <libkern/OSThermalNotification.h> (Libc), the macOS branch of the enum. */
typedef enum {
	kOSThermalPressureLevelNominal = 0,
	kOSThermalPressureLevelModerate,
	kOSThermalPressureLevelHeavy,
	kOSThermalPressureLevelTrapping,
	kOSThermalPressureLevelSleeping
} OSThermalPressureLevel;
extern const char * const kOSThermalNotificationPressureLevelName;
/* its value, the notify(3) name: */
"com.apple.system.thermalpressurelevel"
