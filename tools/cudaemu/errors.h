/* tsemu: error codes shared by the emulated driver and runtime.
 * X(driver code, runtime code, message): the message is what the real
 * cuGetErrorString / cudaGetErrorString return. Both enums use the same
 * numbers for these (runtime.c checks it at compile time), so the runtime
 * turns a CUresult into a cudaError_t by value, as the real one does. */
#ifndef TSEMU_ERRORS_H
#define TSEMU_ERRORS_H

#define TSEMU_ERRORS(X) \
	X(CUDA_SUCCESS, cudaSuccess, "no error") \
	X(CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue, "invalid argument") \
	X(CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation, "out of memory") \
	X(CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError, "initialization error") \
	X(CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading, "driver shutting down") \
	X(CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary, "CUDA driver is a stub library") \
	X(CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice, "no CUDA-capable device is detected") \
	X(CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice, "invalid device ordinal") \
	X(CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized, "invalid device context") \
	X(CUDA_ERROR_MAP_FAILED, cudaErrorMapBufferObjectFailed, "mapping of buffer object failed") \
	X(CUDA_ERROR_ALREADY_MAPPED, cudaErrorAlreadyMapped, "resource already mapped") \
	X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, cudaErrorPeerAccessUnsupported, \
	  "peer access is not supported between these two devices") \
	X(CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle, "invalid resource handle") \
	X(CUDA_ERROR_ILLEGAL_STATE, cudaErrorIllegalState, "the operation cannot be performed in the present state") \
	X(CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound, "named symbol not found") \
	X(CUDA_ERROR_NOT_READY, cudaErrorNotReady, "device not ready") \
	X(CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress, "an illegal memory access was encountered") \
	X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled") \
	X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cudaErrorPeerAccessNotEnabled, "peer access has not been enabled") \
	X(CUDA_ERROR_CONTEXT_IS_DESTROYED, cudaErrorContextIsDestroyed, "context is destroyed") \
	X(CUDA_ERROR_TOO_MANY_PEERS, cudaErrorTooManyPeers, "peer mapping resources exhausted") \
	X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cudaErrorHostMemoryAlreadyRegistered, \
	  "part or all of the requested memory range is already mapped") \
	X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cudaErrorHostMemoryNotRegistered, \
	  "pointer does not correspond to a registered memory region") \
	X(CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted, "operation not permitted") \
	X(CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported, "operation not supported") \
	X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cudaErrorStreamCaptureUnsupported, \
	  "operation not permitted when stream is capturing") \
	X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cudaErrorStreamCaptureInvalidated, \
	  "operation failed due to a previous error during capture") \
	X(CUDA_ERROR_STREAM_CAPTURE_MERGE, cudaErrorStreamCaptureMerge, \
	  "operation would result in a merge of separate capture sequences") \
	X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cudaErrorStreamCaptureUnmatched, \
	  "capture was not ended in the same stream as it began") \
	X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cudaErrorStreamCaptureIsolation, \
	  "dependency created on uncaptured work in another stream") \
	X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cudaErrorStreamCaptureImplicit, \
	  "operation would make the legacy stream depend on a capturing blocking stream") \
	X(CUDA_ERROR_CAPTURED_EVENT, cudaErrorCapturedEvent, \
	  "operation not permitted on an event last recorded in a capturing stream") \
	X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, cudaErrorStreamCaptureWrongThread, \
	  "attempt to terminate a thread-local capture sequence from another thread") \
	X(CUDA_ERROR_UNKNOWN, cudaErrorUnknown, "unknown error")

/* Runtime-only codes: X(runtime code, message). */
#define TSEMU_RT_ERRORS(X) \
	X(cudaErrorInvalidDevicePointer, "invalid device pointer") \
	X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy") \
	X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
	X(cudaErrorCallRequiresNewerDriver, "API call is not supported in the installed CUDA driver")

#endif
