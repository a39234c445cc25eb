/*
 * dlpack.h -- the DLPack ABI, written from the public specification
 * (DLPack C API 1.x and its Python exchange protocol).  Only what this
 * package consumes is declared.
 */
#ifndef AWQ_DLPACK_H
#define AWQ_DLPACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this consumer speaks (DLManagedTensorVersioned). */
#define AWQ_DLPACK_MAJOR 1
#define AWQ_DLPACK_MINOR 0

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/* Device types are int32 in the ABI; only two matter here. */
typedef int32_t DLDeviceType;
enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means C-contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ULL << 1)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* Capsule names of the Python protocol. */
#define AWQ_DLPACK_NAME "dltensor"
#define AWQ_DLPACK_USED_NAME "used_dltensor"
#define AWQ_DLPACK_VERSIONED_NAME "dltensor_versioned"
#define AWQ_DLPACK_VERSIONED_USED_NAME "used_dltensor_versioned"

/*
 * The C exchange API (DLPack 1.2): a producer type may carry
 * `__dlpack_c_exchange_api__`, a capsule named "dlpack_exchange_api"
 * holding a table of C functions.  It lets a consumer view a tensor,
 * query the producer's current stream and allocate in the producer's
 * framework without a Python call -- the difference between ~0.1 us
 * and several us per tensor.  Every function returns 0 on success and
 * -1 with a Python exception set.
 */
#define AWQ_DLPACK_EXCHANGE_API_NAME "dlpack_exchange_api"

typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef int (*DLPackManagedTensorAllocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
                                            void *error_ctx,
                                            void (*set_error)(void *error_ctx, const char *kind,
                                                              const char *message));
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void *py_object,
                                                     DLManagedTensorVersioned **out);
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned *tensor,
                                                   void **out_py_object);
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
                                       void **out_current_stream);

typedef struct {
    DLPackExchangeAPIHeader header;
    DLPackManagedTensorAllocator managed_tensor_allocator;
    DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
    DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
    DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync; /* may be NULL */
    DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#ifdef __cplusplus
}
#endif

#endif /* AWQ_DLPACK_H */
