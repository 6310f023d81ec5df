/*
 * A fake libnvidia-ml.so.1 for the koordlet's GPU tests: the NVML entry points the GPU collector
 * calls through pynvml (nvidia-ml-py), with the C signatures and struct layouts of nvml.h, and
 * values read from the JSON file named by $FAKE_NVML_CONFIG at every call, so that a test
 * changes a device (its memory, a pending Xid event, an error a call returns) by rewriting the
 * file. See tests/nvmlfake/__init__.py for the format and docs/devices.md for how it is used.
 *
 * Built by the tests with: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -lpthread
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_UNKNOWN = 999,
};
#define XID_CRITICAL_ERROR 0x8ULL
#define MAX_DEVICES 64

/* nvml.h's structures, field for field */
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
struct fake_device {
    int index;
};
typedef struct fake_device *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct fake_event_set {
    int registered[MAX_DEVICES];
};
typedef struct fake_event_set *nvmlEventSet_t;

/* A small JSON reader: enough for the config file ------------------------------------------ */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jval {
    enum jtype type;
    double num;
    char *str;           /* J_STR; the key for members of an object */
    struct jval *child;  /* J_ARR, J_OBJ: first element or member */
    struct jval *next;   /* next element or member */
    char *key;
};

static void jfree(struct jval *v) {
    while (v) {
        struct jval *next = v->next;
        jfree(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

static const char *skip(const char *p) {
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

static const char *parse_value(const char *p, struct jval **out);

static const char *parse_string(const char *p, char **out) {
    size_t cap = 64, n = 0;
    char *buf = malloc(cap);
    if (*p != '"' || !buf) { free(buf); return NULL; }
    p++;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            c = *p++;
            switch (c) {
                case 'n': c = '\n'; break;
                case 't': c = '\t'; break;
                case '"': case '\\': case '/': break;
                default: free(buf); return NULL; /* \uXXXX and others: not needed here */
            }
        }
        if (n + 2 > cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) { free(buf); return NULL; }
            buf = bigger;
        }
        buf[n++] = c;
    }
    if (*p != '"') { free(buf); return NULL; }
    buf[n] = 0;
    *out = buf;
    return p + 1;
}

static const char *parse_items(const char *p, struct jval *parent, char close, int members) {
    struct jval **tail = &parent->child;
    p = skip(p);
    if (*p == close) return p + 1;
    for (;;) {
        char *key = NULL;
        struct jval *v = NULL;
        p = skip(p);
        if (members) {
            p = parse_string(p, &key);
            if (!p) return NULL;
            p = skip(p);
            if (*p != ':') { free(key); return NULL; }
            p = skip(p + 1);
        }
        p = parse_value(p, &v);
        if (!p) { free(key); return NULL; }
        v->key = key;
        *tail = v;
        tail = &v->next;
        p = skip(p);
        if (*p == ',') { p++; continue; }
        if (*p == close) return p + 1;
        return NULL;
    }
}

static const char *parse_value(const char *p, struct jval **out) {
    struct jval *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    *out = v;
    p = skip(p);
    if (*p == '{') { v->type = J_OBJ; return parse_items(p + 1, v, '}', 1); }
    if (*p == '[') { v->type = J_ARR; return parse_items(p + 1, v, ']', 0); }
    if (*p == '"') { v->type = J_STR; return parse_string(p, &v->str); }
    if (!strncmp(p, "true", 4)) { v->type = J_BOOL; v->num = 1; return p + 4; }
    if (!strncmp(p, "false", 5)) { v->type = J_BOOL; return p + 5; }
    if (!strncmp(p, "null", 4)) { v->type = J_NULL; return p + 4; }
    char *end;
    v->num = strtod(p, &end);
    if (end == p) return NULL;
    v->type = J_NUM;
    return end;
}

static struct jval *member(const struct jval *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (struct jval *m = obj->child; m; m = m->next)
        if (m->key && !strcmp(m->key, key)) return m;
    return NULL;
}

static struct jval *element(const struct jval *arr, int i) {
    if (!arr || arr->type != J_ARR) return NULL;
    struct jval *e = arr->child;
    while (e && i-- > 0) e = e->next;
    return e;
}

static int length(const struct jval *arr) {
    int n = 0;
    if (arr && arr->type == J_ARR)
        for (struct jval *e = arr->child; e; e = e->next) n++;
    return n;
}

static double number(const struct jval *obj, const char *key, double fallback) {
    struct jval *m = member(obj, key);
    return m && (m->type == J_NUM || m->type == J_BOOL) ? m->num : fallback;
}

static const char *string(const struct jval *obj, const char *key, const char *fallback) {
    struct jval *m = member(obj, key);
    return m && m->type == J_STR ? m->str : fallback;
}

/* State ------------------------------------------------------------------------------------ */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct jval *config;
static int initialized;
static struct fake_device handles[MAX_DEVICES];
static int delivered[MAX_DEVICES]; /* Xid events of each device already returned */

/* Re-read the file; an unreadable or malformed one reads as an empty object (no devices). */
static void load(void) {
    jfree(config);
    config = NULL;
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) return;
    char *text = NULL;
    size_t cap = 0, n = 0, got;
    char chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + got + 1 > cap) {
            char *bigger = realloc(text, cap = (n + got + 1) * 2);
            if (!bigger) break;
            text = bigger;
        }
        memcpy(text + n, chunk, got);
        n += got;
    }
    fclose(f);
    if (!text) return;
    text[n] = 0;
    struct jval *v = NULL;
    if (parse_value(text, &v) && v && v->type == J_OBJ) {
        config = v;
    } else {
        jfree(v);
        fprintf(stderr, "fake NVML: %s is not a JSON object\n", path);
    }
    free(text);
}

static struct jval *devices(void) { return member(config, "devices"); }

/* The error the config asks `fn` to return, globally ("errors") or for device `dev`. */
static nvmlReturn_t forced(const char *fn, const struct jval *dev) {
    int code = (int)number(member(dev, "errors"), fn, 0);
    if (!code) code = (int)number(member(config, "errors"), fn, 0);
    return code;
}

#define ENTER(fn)                                  \
    pthread_mutex_lock(&lock);                     \
    load();                                        \
    nvmlReturn_t ret = forced(fn, NULL);           \
    if (!ret && !initialized) ret = NVML_ERROR_UNINITIALIZED

#define LEAVE() \
    pthread_mutex_unlock(&lock); \
    return ret

/* The device of a handle, or NULL (ret set) when the handle is not one of ours. */
static struct jval *device_of(nvmlDevice_t h, const char *fn, nvmlReturn_t *ret) {
    if (*ret) return NULL;
    if (!h || h < handles || h >= handles + MAX_DEVICES) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    struct jval *dev = element(devices(), h->index);
    if (!dev) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *ret = forced(fn, dev);
    return *ret ? NULL : dev;
}

static nvmlReturn_t copy_out(char *buf, unsigned int size, const char *value) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

/* Entry points ----------------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    load();
    nvmlReturn_t ret = forced("nvmlInitWithFlags", NULL);
    if (!ret) {
        if (!initialized) memset(delivered, 0, sizeof delivered);
        initialized++;
    }
    LEAVE();
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    ENTER("nvmlShutdown");
    if (!ret) initialized--;
    LEAVE();
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_TIMEOUT: return "Timeout";
        default: return "Fake NVML error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    if (!ret) ret = copy_out(version, length, string(config, "driver_version", "535.104.05"));
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount_v2");
    if (!ret) *count = (unsigned int)length(devices());
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    if (!ret && (index >= MAX_DEVICES || !element(devices(), (int)index)))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (!ret) ret = forced("nvmlDeviceGetHandleByIndex_v2", element(devices(), (int)index));
    if (!ret) {
        handles[index].index = (int)index;
        *device = &handles[index];
    }
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    ENTER("nvmlDeviceGetUUID");
    struct jval *dev = device_of(h, "nvmlDeviceGetUUID", &ret);
    if (dev) ret = copy_out(uuid, length, string(dev, "uuid", ""));
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    ENTER("nvmlDeviceGetName");
    struct jval *dev = device_of(h, "nvmlDeviceGetName", &ret);
    if (dev) ret = copy_out(name, length, string(dev, "name", "NVIDIA Fake GPU"));
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) {
    ENTER("nvmlDeviceGetMinorNumber");
    struct jval *dev = device_of(h, "nvmlDeviceGetMinorNumber", &ret);
    if (dev) *minor = (unsigned int)number(dev, "minor", h->index);
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo");
    struct jval *dev = device_of(h, "nvmlDeviceGetMemoryInfo", &ret);
    if (dev) {
        memory->total = (unsigned long long)number(dev, "memory_total", 0);
        memory->used = (unsigned long long)number(dev, "memory_used", 0);
        memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
    }
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *util) {
    ENTER("nvmlDeviceGetUtilizationRates");
    struct jval *dev = device_of(h, "nvmlDeviceGetUtilizationRates", &ret);
    if (dev) {
        util->gpu = (unsigned int)number(dev, "utilization_gpu", 0);
        util->memory = (unsigned int)number(dev, "utilization_memory", 0);
    }
    LEAVE();
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    ENTER("nvmlDeviceGetPciInfo_v3");
    struct jval *dev = device_of(h, "nvmlDeviceGetPciInfo_v3", &ret);
    if (dev) {
        /* bus_id as NVML's legacy form "0000:3B:00.0"; busId has the 8-digit domain */
        const char *legacy = string(dev, "bus_id", "0000:00:00.0");
        memset(pci, 0, sizeof *pci);
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", legacy);
        snprintf(pci->busId, sizeof pci->busId, "0000%s", legacy);
        sscanf(legacy, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
        pci->pciDeviceId = (unsigned int)number(dev, "pci_device_id", 0x20b010de);
    }
    LEAVE();
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER("nvmlEventSetCreate");
    if (!ret) {
        *set = calloc(1, sizeof **set);
        if (!*set) ret = NVML_ERROR_UNKNOWN;
    }
    LEAVE();
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set) {
    ENTER("nvmlDeviceRegisterEvents");
    struct jval *dev = device_of(h, "nvmlDeviceRegisterEvents", &ret);
    if (dev && !set) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (dev && !number(dev, "events_supported", 1)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (dev && (types & XID_CRITICAL_ERROR)) set->registered[h->index] = 1;
    LEAVE();
}

/* Returns the next Xid of `xid_events` not yet returned, of a registered device; else a timeout
 * at once (the collector polls with timeout 0). */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)timeoutms;
    ENTER("nvmlEventSetWait_v2");
    if (!ret && (!set || !data)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (!ret) {
        ret = NVML_ERROR_TIMEOUT;
        int n = length(devices());
        for (int i = 0; i < n && i < MAX_DEVICES && ret == NVML_ERROR_TIMEOUT; i++) {
            struct jval *xids = member(element(devices(), i), "xid_events");
            if (!set->registered[i] || delivered[i] >= length(xids)) continue;
            handles[i].index = i;
            memset(data, 0, sizeof *data);
            data->device = &handles[i];
            data->eventType = XID_CRITICAL_ERROR;
            data->eventData = (unsigned long long)element(xids, delivered[i]++)->num;
            ret = NVML_SUCCESS;
        }
    }
    LEAVE();
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER("nvmlEventSetFree");
    if (!ret) free(set);
    LEAVE();
}
