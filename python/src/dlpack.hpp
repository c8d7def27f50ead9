// The DLPack exchange structs (dlpack.h, ABI version 0.8; the legacy "dltensor" capsule that
// torch.from_dlpack and numpy take), and a capsule of bytes kept alive by a shared_ptr. The
// capsule's deleter touches no Python object: a tensor may be freed on any thread, GIL or not.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

namespace ferry::python {

enum DlDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 1: unsigned int
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// What a capsule's DLManagedTensor owns: the memory's keeper and the shape array.
struct DlpackOwner {
  DLManagedTensor managed{};
  std::shared_ptr<void> keep;
  int64_t shape[1] = {0};
};

inline void DeleteDlpackOwner(DLManagedTensor* t) {
  const std::unique_ptr<DlpackOwner> owner(static_cast<DlpackOwner*>(t->manager_ctx));
}

inline pybind11::capsule MakeDlpackCapsule(std::shared_ptr<void> keep, void* data, int64_t nbytes, int device_type,
                                           int device_id) {
  auto owner = std::make_unique<DlpackOwner>();
  owner->keep = std::move(keep);
  owner->shape[0] = nbytes;
  DLTensor& t = owner->managed.dl_tensor;
  t.data = data;
  t.device = {device_type, device_id};
  t.ndim = 1;
  t.dtype = {1, 8, 1};
  t.shape = owner->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  owner->managed.manager_ctx = owner.get();
  owner->managed.deleter = DeleteDlpackOwner;
  DLManagedTensor* managed = &owner.release()->managed;
  // A consumer renames the capsule "used_dltensor" and calls the deleter itself; an unconsumed
  // capsule is deleted here.
  return pybind11::capsule(managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor") != 0) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

}  // namespace ferry::python
