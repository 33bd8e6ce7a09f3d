// kiln-cpp's host runtime: the Python module ``kiln_host_runtime``, built once per
// installation against libtorch (see runtime.py).
//
// - ``Program(init, call, n_inputs, n_outputs, externs, name)`` wraps a compiled host
//   program (the addresses of its ``kiln_host_init`` and ``kiln_host_call``). Calling it
//   with tensors runs the program: no Python runs between the call and the kernels.
//   ``Program(0, 0, ...)`` is one whose library is still being built: its calls run the
//   fallback until ``start(init, call, functions)`` hands it the library's entry points
//   (the programs ``bind_last`` made from it start with it).
// - ``Extern(op, overload, template, n_outputs)`` is an ATen op call prepared once: its
//   arguments converted to IValues, with slots for the tensors the program passes.
// - ``scalar_type(dtype)`` and ``device_code(device)`` give the numbers the generated
//   source writes for a dtype and a device.
#include <Python.h>
#include <structmember.h>

#include <dlfcn.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <type_traits>
#include <vector>

extern "C" {
#include "kiln_host.h"
}

namespace {

// -- errors: kept per thread until the Program call that failed raises them ----------------
enum class ErrorKind { Runtime, Index, Value, Type, NotImplemented, LinAlg, OutOfMemory };
// torch.linalg.LinAlgError and torch.OutOfMemoryError, looked up when the module loads
PyObject* linalg_error = nullptr;
PyObject* out_of_memory_error = nullptr;
thread_local std::string last_error;
thread_local ErrorKind last_kind = ErrorKind::Runtime;

void keep_error(const std::exception& e) {
  last_error = e.what();
  last_kind = ErrorKind::Runtime;
  if (dynamic_cast<const c10::IndexError*>(&e)) last_kind = ErrorKind::Index;
  else if (dynamic_cast<const c10::ValueError*>(&e)) last_kind = ErrorKind::Value;
  else if (dynamic_cast<const c10::TypeError*>(&e)) last_kind = ErrorKind::Type;
  else if (dynamic_cast<const c10::NotImplementedError*>(&e))
    last_kind = ErrorKind::NotImplemented;
  else if (dynamic_cast<const c10::LinAlgError*>(&e)) last_kind = ErrorKind::LinAlg;
  else if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) last_kind = ErrorKind::OutOfMemory;
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) last_error = c10e->what_without_backtrace();
}

void raise_kept() {
  PyObject* type = PyExc_RuntimeError;
  switch (last_kind) {
    case ErrorKind::Index: type = PyExc_IndexError; break;
    case ErrorKind::Value: type = PyExc_ValueError; break;
    case ErrorKind::Type: type = PyExc_TypeError; break;
    case ErrorKind::NotImplemented: type = PyExc_NotImplementedError; break;
    case ErrorKind::LinAlg: type = linalg_error ? linalg_error : type; break;
    case ErrorKind::OutOfMemory: type = out_of_memory_error ? out_of_memory_error : type; break;
    default: break;
  }
  PyErr_SetString(type, last_error.empty() ? "kiln host program failed" : last_error.c_str());
  last_error.clear();
}

at::Tensor* T(KilnTensor* t) { return reinterpret_cast<at::Tensor*>(t); }
KilnTensor* K(at::Tensor* t) { return reinterpret_cast<KilnTensor*>(t); }

// -- the table the host programs call --------------------------------------------------------
KilnTensor* api_empty_strided(int ndim, const int64_t* size, const int64_t* stride, int dtype,
                              int device_type, int device_index) {
  try {
    auto options = at::TensorOptions()
                       .dtype(static_cast<c10::ScalarType>(dtype))
                       .device(c10::Device(static_cast<c10::DeviceType>(device_type),
                                           static_cast<c10::DeviceIndex>(device_index)));
    return K(new at::Tensor(
        at::empty_strided(c10::IntArrayRef(size, ndim), c10::IntArrayRef(stride, ndim), options)));
  } catch (const std::exception& e) {
    keep_error(e);
    return nullptr;
  }
}

KilnTensor* api_view(KilnTensor* base, int ndim, const int64_t* size, const int64_t* stride,
                     int64_t offset) {
  try {
    const at::Tensor& b = *T(base);
    return K(new at::Tensor(at::as_strided(b, c10::IntArrayRef(size, ndim),
                                           c10::IntArrayRef(stride, ndim),
                                           b.storage_offset() + offset)));
  } catch (const std::exception& e) {
    keep_error(e);
    return nullptr;
  }
}

KilnTensor* api_arena_view(KilnTensor* arena, int64_t byte_offset, int ndim, const int64_t* size,
                           const int64_t* stride, int dtype) {
  try {
    const at::Tensor& block = *T(arena);
    const auto meta = c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(dtype));
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(block.storage()),
                                                     block.key_set(), meta);
    impl->set_sizes_and_strides(c10::IntArrayRef(size, ndim), c10::IntArrayRef(stride, ndim),
                                byte_offset / static_cast<int64_t>(meta.itemsize()));
    return K(new at::Tensor(std::move(impl)));
  } catch (const std::exception& e) {
    keep_error(e);
    return nullptr;
  }
}

KilnTensor* api_alias(KilnTensor* t) { return K(new at::Tensor(*T(t))); }

void api_release(KilnTensor* t) { delete T(t); }

void* api_data_ptr(KilnTensor* t) { return T(t)->defined() ? T(t)->data_ptr() : nullptr; }

int64_t api_size(KilnTensor* t, int dim) { return T(t)->size(dim); }

int64_t api_stride(KilnTensor* t, int dim) { return T(t)->stride(dim); }

KilnTensor* api_match_layout(KilnTensor* t, int ndim, const int64_t* size, const int64_t* stride,
                             const char* what) {
  try {
    const at::Tensor& x = *T(t);
    if (x.dim() != ndim || x.sizes() != c10::IntArrayRef(size, ndim)) {
      TORCH_CHECK_VALUE(false, what, " has size ", x.sizes(), " but the graph was compiled for ",
                        c10::IntArrayRef(size, ndim));
    }
    bool same = true;
    for (int d = 0; d < ndim; ++d) same = same && (size[d] <= 1 || x.stride(d) == stride[d]);
    if (same) return K(new at::Tensor(x));
    at::Tensor out = at::empty_strided(c10::IntArrayRef(size, ndim),
                                       c10::IntArrayRef(stride, ndim), x.options());
    out.copy_(x);
    return K(new at::Tensor(std::move(out)));
  } catch (const std::exception& e) {
    keep_error(e);
    return nullptr;
  }
}

void api_index_error(const char* kernel) {
  last_kind = ErrorKind::Index;
  last_error = std::string(kernel) + ": an index is out of range of the tensor it indexes";
}

// -- CUDA: the current stream, and kernels launched through the driver ------------------------
// (no CUDA headers: torch's device guard gives the stream, libcuda's entry point is looked up
// once, in the libcuda torch has loaded)
using CuLaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, void*, void**, void**);
using CuGetErrorString = int (*)(int, const char**);

void* api_cuda_stream() {
  try {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    return impl->getStream(impl->getDevice()).native_handle();
  } catch (const std::exception& e) {
    keep_error(e);
    return nullptr;
  }
}

void* libcuda_symbol(const char* name) {
  static void* lib = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h != nullptr ? h : dlopen("libcuda.so.1", RTLD_NOW);
  }();
  return lib != nullptr ? dlsym(lib, name) : nullptr;
}

int api_cuda_launch(void* stream, void* function, uint32_t gx, uint32_t gy, uint32_t gz,
                    uint32_t block_x, uint32_t shared, void** params) {
  static auto launch = reinterpret_cast<CuLaunchKernel>(libcuda_symbol("cuLaunchKernel"));
  if (launch == nullptr) {
    last_kind = ErrorKind::Runtime;
    last_error = "cuLaunchKernel is not in libcuda.so.1: is the CUDA driver installed?";
    return 1;
  }
  if (gx == 0 || gy == 0 || gz == 0) return 0;
  int status = launch(function, gx, gy, gz, block_x, 1, 1, shared, stream, params, nullptr);
  if (status != 0) {
    static auto describe = reinterpret_cast<CuGetErrorString>(libcuda_symbol("cuGetErrorString"));
    const char* text = nullptr;
    if (describe != nullptr) describe(status, &text);
    last_kind = ErrorKind::Runtime;
    last_error = std::string("cuLaunchKernel failed: ") + (text ? text : std::to_string(status));
    return 1;
  }
  return 0;
}

// -- CUDA: matrix products through cuBLASLt --------------------------------------------------
#include "cuda_gemm.h"

// -- prepared extern calls ---------------------------------------------------------------------
struct TensorSlot {
  size_t position;  // in the stack
  int tensor;       // index into the program's tensors; -1 for None (lists only)
};

struct ListSlot {
  size_t position;
  std::vector<int> tensors;  // -1 for None
  bool optional_items;
};

struct SizeSlot {
  size_t position;
  int size;  // index into the program's sizes
};

struct SizeListSlot {
  size_t position;
  std::vector<std::pair<bool, int64_t>> items;  // (a size slot, its index) or (no, the value)
};

}  // namespace

struct KilnExtern {
  std::optional<c10::OperatorHandle> op;  // set once found
  std::vector<c10::IValue> stack;  // the arguments, tensors left as None
  std::vector<TensorSlot> slots;
  std::vector<ListSlot> lists;
  std::vector<SizeSlot> sizes;
  std::vector<SizeListSlot> size_lists;
  int n_outputs;
  std::string name;
};

namespace {

int api_call_extern(KilnExtern* x, KilnTensor* const* tensors, const int64_t* sizes,
                    KilnTensor** outputs) {
  try {
    std::vector<c10::IValue> stack = x->stack;
    for (const auto& s : x->slots) stack[s.position] = *T(tensors[s.tensor]);
    for (const auto& s : x->sizes) stack[s.position] = sizes[s.size];
    for (const auto& l : x->size_lists) {
      std::vector<int64_t> items;
      for (const auto& [slot, v] : l.items) items.push_back(slot ? sizes[v] : v);
      stack[l.position] = c10::IValue(items);
    }
    for (const auto& l : x->lists) {
      if (l.optional_items) {
        c10::List<std::optional<at::Tensor>> items;
        for (int i : l.tensors)
          items.push_back(i < 0 ? std::optional<at::Tensor>() : std::optional(*T(tensors[i])));
        stack[l.position] = std::move(items);
      } else {
        c10::List<at::Tensor> items;
        for (int i : l.tensors) items.push_back(*T(tensors[i]));
        stack[l.position] = std::move(items);
      }
    }
    x->op->callBoxed(stack);
    for (int i = 0; i < x->n_outputs; ++i) {
      if (outputs[i] != nullptr) continue;  // the program does not want this one
      // an undefined tensor (None) flows on as one, as it does through Python
      outputs[i] = K(new at::Tensor(stack[i].isTensor() ? stack[i].toTensor() : at::Tensor()));
    }
    return 0;
  } catch (const std::exception& e) {
    keep_error(e);
    last_error = x->name + ": " + last_error;
    return 1;
  }
}

const KilnApi API = {
    KILN_API_VERSION, api_empty_strided, api_view,        api_arena_view,  api_alias,
    api_release,
    api_data_ptr,     api_size,          api_stride,      api_call_extern, api_match_layout,
    api_index_error,  api_cuda_stream,   api_cuda_launch, api_cuda_gemm,
};

// -- Python -> IValue, for the arguments of an extern call -------------------------------------
// A template item is a tuple (tag, value): ("t", k) tensor slot k, ("tl", [k|None, ...]) a
// tensor list ("otl": of optional tensors), ("none",), ("default",), ("i", int), ("f", float),
// ("b", bool), ("s", str), ("il", [int]), ("fl", [float]), ("bl", [bool]), ("dtype", dtype),
// ("device", device), ("layout", layout), ("memory_format", memory_format), ("undefined",)
// an undefined tensor, ("si", k) the program's size k, ("sil", [("s", k) | int, ...]) a list
// of ints some of which are the program's sizes, ("wn", number) a number passed for a Tensor
// argument (a wrapped-number tensor, as Python's bindings make one).
bool to_ivalue(PyObject* item, const c10::Argument& arg, size_t position, KilnExtern* x,
               c10::IValue* out) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 1) {
    PyErr_SetString(PyExc_TypeError, "an extern template item is a (tag, value) tuple");
    return false;
  }
  std::string tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
  PyObject* v = PyTuple_GET_SIZE(item) > 1 ? PyTuple_GET_ITEM(item, 1) : Py_None;
  if (tag == "none") {
    *out = c10::IValue();
  } else if (tag == "undefined") {
    *out = at::Tensor();
  } else if (tag == "default") {
    if (!arg.default_value()) {
      PyErr_Format(PyExc_TypeError, "%s: argument %s has no default", x->name.c_str(),
                   arg.name().c_str());
      return false;
    }
    *out = *arg.default_value();
  } else if (tag == "t") {
    x->slots.push_back({position, static_cast<int>(PyLong_AsLong(v))});
  } else if (tag == "tl" || tag == "otl") {
    ListSlot l{position, {}, tag == "otl"};
    for (Py_ssize_t i = 0; i < PyList_Size(v); ++i) {
      PyObject* k = PyList_GET_ITEM(v, i);
      l.tensors.push_back(k == Py_None ? -1 : static_cast<int>(PyLong_AsLong(k)));
    }
    x->lists.push_back(std::move(l));
  } else if (tag == "i") {
    *out = static_cast<int64_t>(PyLong_AsLongLong(v));
  } else if (tag == "si") {  // a size the program passes
    x->sizes.push_back({position, static_cast<int>(PyLong_AsLong(v))});
  } else if (tag == "sil") {  // a list of ints, some of them sizes: [("s", k) | int, ...]
    SizeListSlot l{position, {}};
    for (Py_ssize_t i = 0; i < PyList_Size(v); ++i) {
      PyObject* item = PyList_GET_ITEM(v, i);
      if (PyTuple_Check(item))
        l.items.push_back({true, PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1))});
      else
        l.items.push_back({false, PyLong_AsLongLong(item)});
    }
    x->size_lists.push_back(std::move(l));
  } else if (tag == "f") {
    *out = PyFloat_AsDouble(v);
  } else if (tag == "wn") {
    at::Scalar number = PyBool_Check(v)   ? at::Scalar(static_cast<bool>(PyObject_IsTrue(v)))
                        : PyLong_Check(v) ? at::Scalar(static_cast<int64_t>(PyLong_AsLongLong(v)))
                        : PyComplex_Check(v)
                            ? at::Scalar(c10::complex<double>(PyComplex_RealAsDouble(v),
                                                              PyComplex_ImagAsDouble(v)))
                            : at::Scalar(PyFloat_AsDouble(v));
    at::Tensor wrapped = c10::scalar_to_tensor(number);
    wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
    *out = wrapped;
  } else if (tag == "b") {
    *out = static_cast<bool>(PyObject_IsTrue(v));
  } else if (tag == "s") {
    *out = std::string(PyUnicode_AsUTF8(v));
  } else if (tag == "il") {
    std::vector<int64_t> items;
    for (Py_ssize_t i = 0; i < PyList_Size(v); ++i)
      items.push_back(PyLong_AsLongLong(PyList_GET_ITEM(v, i)));
    *out = c10::IValue(items);
  } else if (tag == "fl") {
    std::vector<double> items;
    for (Py_ssize_t i = 0; i < PyList_Size(v); ++i)
      items.push_back(PyFloat_AsDouble(PyList_GET_ITEM(v, i)));
    *out = c10::IValue(items);
  } else if (tag == "bl") {
    c10::List<bool> items;
    for (Py_ssize_t i = 0; i < PyList_Size(v); ++i)
      items.push_back(PyObject_IsTrue(PyList_GET_ITEM(v, i)));
    *out = c10::IValue(items);
  } else if (tag == "dtype" && THPDtype_Check(v)) {
    *out = reinterpret_cast<THPDtype*>(v)->scalar_type;
  } else if (tag == "device" && THPDevice_Check(v)) {
    *out = reinterpret_cast<THPDevice*>(v)->device;
  } else if (tag == "layout" && THPLayout_Check(v)) {
    *out = reinterpret_cast<THPLayout*>(v)->layout;
  } else if (tag == "memory_format" && THPMemoryFormat_Check(v)) {
    *out = reinterpret_cast<THPMemoryFormat*>(v)->memory_format;
  } else {
    PyErr_Format(PyExc_TypeError, "%s: cannot pass argument %s (tag %s)", x->name.c_str(),
                 arg.name().c_str(), tag.c_str());
    return false;
  }
  return !PyErr_Occurred();
}

void extern_destructor(PyObject* capsule) {
  delete static_cast<KilnExtern*>(PyCapsule_GetPointer(capsule, "kiln.Extern"));
}

PyObject* make_extern(PyObject*, PyObject* args) {
  const char *name, *overload;
  PyObject* items;
  int n_outputs;
  if (!PyArg_ParseTuple(args, "ssO!i", &name, &overload, &PyList_Type, &items, &n_outputs))
    return nullptr;
  auto x = std::make_unique<KilnExtern>();
  try {
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!handle) {
      PyErr_Format(PyExc_ValueError, "no ATen operator %s.%s", name, overload);
      return nullptr;
    }
    x->op = *handle;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  x->name = std::string(name) + "." + overload;
  x->n_outputs = n_outputs;
  const auto& arguments = x->op->schema().arguments();
  if (static_cast<size_t>(PyList_Size(items)) != arguments.size()) {
    PyErr_Format(PyExc_TypeError, "%s takes %zu arguments, the template has %zd",
                 x->name.c_str(), arguments.size(), PyList_Size(items));
    return nullptr;
  }
  x->stack.resize(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!to_ivalue(PyList_GET_ITEM(items, i), arguments[i], i, x.get(), &x->stack[i]))
      return nullptr;
  }
  return PyCapsule_New(x.release(), "kiln.Extern", extern_destructor);
}

// -- Program -----------------------------------------------------------------------------------
using InitFn = int (*)(const KilnApi*, KilnExtern* const*, void* const*);
using CallFn = int (*)(KilnTensor* const*, KilnTensor**);

// the program's entry point, shared by the programs bind_last makes from it: null until a
// library built in the background is started
struct Entry {
  CallFn call = nullptr;
  Py_ssize_t users = 1;
};

struct ProgramObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Entry* entry;
  Py_ssize_t n_inputs;  // passed by the caller
  Py_ssize_t n_outputs;
  PyObject* externs;    // tuple of capsules, kept alive
  PyObject* bound;      // tuple of tensors passed after the caller's (the graph's constants)
  PyObject* fallback;   // the Python host program, for calls it must run (KILN_RUN_PYTHON)
  PyObject* name;
  PyObject* dict;
};

PyObject* program_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf,
                             PyObject* kwnames) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a compiled host program takes no keyword arguments");
    return nullptr;
  }
  if (n != self->n_inputs) {
    PyErr_Format(PyExc_TypeError, "%U takes %zd inputs, got %zd", self->name, self->n_inputs, n);
    return nullptr;
  }
  Py_ssize_t n_bound = PyTuple_GET_SIZE(self->bound);
  std::vector<KilnTensor*> in(n + n_bound);
  for (Py_ssize_t i = 0; i < n + n_bound; ++i) {
    PyObject* a = i < n ? args[i] : PyTuple_GET_ITEM(self->bound, i - n);
    if (a == Py_None) {  // an undefined tensor, as ATen's Python bindings pass None
      static at::Tensor undefined;
      in[i] = K(&undefined);
      continue;
    }
    if (!THPVariable_Check(a)) {
      PyErr_Format(PyExc_TypeError, "%U: input %zd is a %s, expected a tensor", self->name, i,
                   Py_TYPE(a)->tp_name);
      return nullptr;
    }
    in[i] = K(const_cast<at::Tensor*>(&THPVariable_Unpack(a)));
  }
  std::vector<KilnTensor*> out(self->n_outputs, nullptr);
  CallFn call = self->entry->call;
  if (call == nullptr && self->fallback == Py_None) {
    PyErr_Format(PyExc_RuntimeError, "%U: its library is not built yet", self->name);
    return nullptr;
  }
  int status = call == nullptr ? KILN_RUN_PYTHON : call(in.data(), out.data());
  if (status == KILN_RUN_PYTHON && self->fallback != Py_None) {
    for (auto* t : out) delete T(t);
    std::vector<PyObject*> all(args, args + n);
    for (Py_ssize_t i = 0; i < n_bound; ++i) all.push_back(PyTuple_GET_ITEM(self->bound, i));
    return PyObject_Vectorcall(self->fallback, all.data(), all.size(), nullptr);
  }
  if (status != 0) {
    for (auto* t : out) delete T(t);
    raise_kept();
    return nullptr;
  }
  PyObject* result = PyTuple_New(self->n_outputs);
  for (Py_ssize_t i = 0; i < self->n_outputs; ++i) {
    at::Tensor* t = T(out[i]);
    PyTuple_SET_ITEM(result, i, THPVariable_Wrap(std::move(*t)));
    delete t;
  }
  return result;
}

void program_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  if (--self->entry->users == 0) delete self->entry;
  Py_XDECREF(self->externs);
  Py_XDECREF(self->bound);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->name);
  Py_XDECREF(self->dict);
  Py_TYPE(self_)->tp_free(self_);
}

PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* new_program(Entry* entry, Py_ssize_t n_inputs, Py_ssize_t n_outputs, PyObject* externs,
                      PyObject* bound, PyObject* fallback, PyObject* name) {
  auto* self = PyObject_New(ProgramObject, &ProgramType);
  if (self == nullptr) return nullptr;
  self->vectorcall = program_vectorcall;
  self->entry = entry;
  self->n_inputs = n_inputs;
  self->n_outputs = n_outputs;
  Py_INCREF(externs);
  self->externs = externs;
  Py_INCREF(bound);
  self->bound = bound;
  Py_INCREF(fallback);
  self->fallback = fallback;
  Py_INCREF(name);
  self->name = name;
  self->dict = nullptr;
  return reinterpret_cast<PyObject*>(self);
}

// runs the library's kiln_host_init and makes ``call`` the entry's: 0 or -1 (an error set)
int start_entry(Entry* entry, unsigned long long init_address, unsigned long long call_address,
                PyObject* externs, PyObject* functions) {
  std::vector<void*> handles;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(functions); ++i) {
    handles.push_back(PyLong_AsVoidPtr(PyTuple_GET_ITEM(functions, i)));
    if (PyErr_Occurred()) return -1;
  }
  std::vector<KilnExtern*> prepared;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(externs); ++i) {
    PyObject* capsule = PyTuple_GET_ITEM(externs, i);  // a kiln.Extern or a kiln.Gemm
    void* p = PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule));
    if (p == nullptr) return -1;
    prepared.push_back(static_cast<KilnExtern*>(p));
  }
  auto init = reinterpret_cast<InitFn>(init_address);
  if (init(&API, prepared.data(), handles.data()) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "the host program was built for another runtime");
    return -1;
  }
  entry->call = reinterpret_cast<CallFn>(call_address);
  return 0;
}

PyObject* program_new(PyTypeObject*, PyObject* args, PyObject*) {
  unsigned long long init_address, call_address;
  Py_ssize_t n_inputs, n_outputs;
  PyObject *externs, *functions, *name;
  if (!PyArg_ParseTuple(args, "KKnnO!O!U", &init_address, &call_address, &n_inputs, &n_outputs,
                        &PyTuple_Type, &externs, &PyTuple_Type, &functions, &name))
    return nullptr;
  auto* entry = new Entry();
  bool pending = init_address == 0 && call_address == 0;
  if (!pending && start_entry(entry, init_address, call_address, externs, functions) != 0) {
    delete entry;
    return nullptr;
  }
  PyObject* empty = PyTuple_New(0);
  PyObject* self = new_program(entry, n_inputs, n_outputs, externs, empty, Py_None, name);
  Py_DECREF(empty);
  if (self == nullptr) delete entry;
  return self;
}

PyObject* program_start(PyObject* self_, PyObject* args) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  unsigned long long init_address, call_address;
  PyObject* functions;
  if (!PyArg_ParseTuple(args, "KKO!", &init_address, &call_address, &PyTuple_Type, &functions))
    return nullptr;
  if (self->entry->call != nullptr) {
    PyErr_Format(PyExc_RuntimeError, "%U is started already", self->name);
    return nullptr;
  }
  if (start_entry(self->entry, init_address, call_address, self->externs, functions) != 0)
    return nullptr;
  Py_RETURN_NONE;
}

PyObject* program_started(PyObject* self_, void*) {
  return PyBool_FromLong(reinterpret_cast<ProgramObject*>(self_)->entry->call != nullptr);
}

PyObject* program_bind_last(PyObject* self_, PyObject* values) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  if (!PyTuple_Check(values)) {
    PyErr_SetString(PyExc_TypeError, "bind_last takes a tuple of tensors");
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(values);
  if (n > self->n_inputs) {
    PyErr_Format(PyExc_TypeError, "%U takes %zd inputs, cannot bind %zd", self->name,
                 self->n_inputs, n);
    return nullptr;
  }
  PyObject* bound = PySequence_Concat(values, self->bound);
  if (bound == nullptr) return nullptr;
  ++self->entry->users;
  PyObject* result = new_program(self->entry, self->n_inputs - n, self->n_outputs, self->externs,
                                 bound, self->fallback, self->name);
  Py_DECREF(bound);
  if (result == nullptr) --self->entry->users;
  return result;
}

PyObject* program_repr(PyObject* self_) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  return PyUnicode_FromFormat("CompiledHostProgram(%U, %zd inputs)", self->name, self->n_inputs);
}

PyObject* program_set_fallback(PyObject* self_, PyObject* fallback) {
  auto* self = reinterpret_cast<ProgramObject*>(self_);
  if (fallback != Py_None && !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "set_fallback takes a callable or None");
    return nullptr;
  }
  Py_INCREF(fallback);
  Py_SETREF(self->fallback, fallback);
  Py_RETURN_NONE;
}

PyMethodDef program_methods[] = {
    {"set_fallback", program_set_fallback, METH_O,
     "The Python host program (taking every input), for calls the native one hands back."},
    {"bind_last", program_bind_last, METH_O,
     "The program with its last inputs bound to these tensors (the graph's constants)."},
    {"start", program_start, METH_VARARGS,
     "start(init, call, functions): a pending program runs its built library from now on."},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef program_members[] = {
    {"name", T_OBJECT, offsetof(ProgramObject, name), READONLY, "the graph's name"},
    {"n_inputs", T_PYSSIZET, offsetof(ProgramObject, n_inputs), READONLY, "inputs it takes"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef program_getset[] = {
    {"started", program_started, nullptr, "whether it runs its library (else the fallback)",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// -- TensorsMatch: the tensor checks of a guard, in one call -----------------------------------
// Each spec is (type, dtype, device index or None, size, stride, requires_grad, dispatch
// keys): exactly the checks of kiln-capture's reference matcher, read without Python.
struct TensorSpec {
  PyObject* type;
  c10::ScalarType dtype;
  int device_index;  // -1: not checked (the CPU: the dispatch keys tell it apart)
  std::vector<int64_t> size, stride;
  bool requires_grad;
  uint64_t keys;
};

struct MatchObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<TensorSpec>* specs;
};

bool tensor_matches(PyObject* obj, const TensorSpec& s) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != s.type || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.sizes() != c10::IntArrayRef(s.size)) return false;
  if (t.layout() != c10::kStrided || t.strides() != c10::IntArrayRef(s.stride)) return false;
  if (t.scalar_type() != s.dtype) return false;
  if (s.device_index >= 0 && (t.is_cpu() || t.device().index() != s.device_index)) return false;
  return t.requires_grad() == s.requires_grad && t.key_set().raw_repr() == s.keys;
}

PyObject* match_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject*) {
  auto* self = reinterpret_cast<MatchObject*>(self_);
  size_t n = PyVectorcall_NARGS(nargsf);
  if (n != self->specs->size()) Py_RETURN_FALSE;
  for (size_t i = 0; i < n; ++i) {
    if (!tensor_matches(args[i], (*self->specs)[i])) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

void match_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<MatchObject*>(self_);
  if (self->specs != nullptr) {
    for (auto& s : *self->specs) Py_XDECREF(s.type);
    delete self->specs;
  }
  Py_TYPE(self_)->tp_free(self_);
}

bool int_tuple(PyObject* obj, std::vector<int64_t>* out) {
  PyObject* seq = PySequence_Fast(obj, "size and stride are sequences of ints");
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i)
    out->push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i)));
  Py_DECREF(seq);
  return !PyErr_Occurred();
}

PyObject* match_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject* items;
  if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &items)) return nullptr;
  auto specs = std::make_unique<std::vector<TensorSpec>>();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); ++i) {
    PyObject *cls, *dtype, *index, *size, *stride, *grad;
    unsigned long long keys;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(items, i), "O!O!OOOOK", &PyType_Type, &cls,
                          &THPDtypeType, &dtype, &index, &size, &stride, &grad, &keys))
      return nullptr;
    TensorSpec s{cls, reinterpret_cast<THPDtype*>(dtype)->scalar_type,
                 index == Py_None ? -1 : static_cast<int>(PyLong_AsLong(index)), {}, {},
                 PyObject_IsTrue(grad) == 1, keys};
    if (!int_tuple(size, &s.size) || !int_tuple(stride, &s.stride)) return nullptr;
    Py_INCREF(cls);
    specs->push_back(std::move(s));
  }
  auto* self = reinterpret_cast<MatchObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = match_vectorcall;
  self->specs = specs.release();
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject MatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- TensorsOn: many tensors over one storage, in one call -------------------------------------
// Each spec is (dtype, size, stride, offset in elements). Called with a torch.UntypedStorage,
// it returns a list of new tensors over it, as ``torch.empty(0).set_(storage, offset, size,
// stride)`` would make each (kiln-cudagraphs hands out a replay's outputs this way).
struct ViewSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> size, stride;
  int64_t offset;
};

struct OnObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<ViewSpec>* specs;
};

PyObject* on_vectorcall(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject*) {
  auto* self = reinterpret_cast<OnObject*>(self_);
  if (PyVectorcall_NARGS(nargsf) != 1 || !THPStorage_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "TensorsOn(specs) is called with one torch.UntypedStorage");
    return nullptr;
  }
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(self->specs->size()));
  if (list == nullptr) return nullptr;
  try {
    // Each tensor is made as torch's own factories make one (a TensorImpl over the storage,
    // then its geometry), without the two dispatcher calls of ``empty(0).set_(...)``: the
    // specs come from the recorded outputs, so the storage holds them.
    const c10::Storage& storage = THPStorage_Unpack(args[0]);
    const c10::DispatchKeySet keys(
        c10::computeDispatchKey(std::nullopt, c10::kStrided, storage.device()));
    for (size_t i = 0; i < self->specs->size(); ++i) {
      const ViewSpec& v = (*self->specs)[i];
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::Storage(storage), keys, caffe2::TypeMeta::fromScalarType(v.dtype));
      impl->set_sizes_and_strides(v.size, v.stride, v.offset);
      PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(at::Tensor(std::move(impl))));
    }
  } catch (const std::exception& e) {
    Py_DECREF(list);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return list;
}

void on_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<OnObject*>(self_);
  delete self->specs;
  Py_TYPE(self_)->tp_free(self_);
}

PyObject* on_new(PyTypeObject* type, PyObject* args, PyObject*) {
  PyObject* items;
  if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &items)) return nullptr;
  auto specs = std::make_unique<std::vector<ViewSpec>>();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); ++i) {
    PyObject *dtype, *size, *stride;
    long long offset;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(items, i), "O!OOL", &THPDtypeType, &dtype, &size,
                          &stride, &offset))
      return nullptr;
    ViewSpec v{reinterpret_cast<THPDtype*>(dtype)->scalar_type, {}, {}, offset};
    if (!int_tuple(size, &v.size) || !int_tuple(stride, &v.stride)) return nullptr;
    specs->push_back(std::move(v));
  }
  auto* self = reinterpret_cast<OnObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = on_vectorcall;
  self->specs = specs.release();
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject OnType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- dtype and device numbers ----------------------------------------------------------------
PyObject* scalar_type(PyObject*, PyObject* dtype) {
  if (!THPDtype_Check(dtype)) {
    PyErr_SetString(PyExc_TypeError, "scalar_type takes a torch.dtype");
    return nullptr;
  }
  return PyLong_FromLong(static_cast<long>(reinterpret_cast<THPDtype*>(dtype)->scalar_type));
}

PyObject* device_code(PyObject*, PyObject* device) {
  if (!THPDevice_Check(device)) {
    PyErr_SetString(PyExc_TypeError, "device_code takes a torch.device");
    return nullptr;
  }
  const c10::Device& d = reinterpret_cast<THPDevice*>(device)->device;
  return Py_BuildValue("(ii)", static_cast<int>(d.type()), static_cast<int>(d.index()));
}

PyMethodDef module_methods[] = {
    {"Extern", make_extern, METH_VARARGS,
     "Extern(op, overload, template, n_outputs): an ATen op call prepared once."},
    {"Gemm", make_gemm, METH_VARARGS,
     "Gemm(dtype, m, n, k, a_ld, a_by_columns, b_ld, b_by_columns, d_ld, bias, device, name): "
     "a matrix product on CUDA through cuBLASLt, prepared once."},
    {"scalar_type", scalar_type, METH_O, "The c10::ScalarType number of a torch.dtype."},
    {"device_code", device_code, METH_O, "(c10::DeviceType number, index) of a torch.device."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kiln_host_runtime",
                          "kiln-cpp's host runtime (see runtime.cpp)", -1, module_methods};

}  // namespace

// a type whose instances are called through their vectorcall slot at ``offset``
static int ready_callable_type(PyTypeObject* type, const char* name, Py_ssize_t size, newfunc make,
                        destructor dealloc, Py_ssize_t offset, const char* doc) {
  type->tp_name = name;
  type->tp_basicsize = size;
  type->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type->tp_new = make;
  type->tp_dealloc = dealloc;
  type->tp_call = PyVectorcall_Call;
  type->tp_vectorcall_offset = offset;
  type->tp_doc = doc;
  return PyType_Ready(type);
}

static PyObject* attribute_of(const char* module, const char* name) {
  PyObject* m = PyImport_ImportModule(module);
  PyObject* found = m != nullptr ? PyObject_GetAttrString(m, name) : nullptr;
  Py_XDECREF(m);
  if (found == nullptr) PyErr_Clear();  // an older torch: RuntimeError stands in
  return found;
}

PyMODINIT_FUNC PyInit_kiln_host_runtime() {
  linalg_error = attribute_of("torch.linalg", "LinAlgError");
  out_of_memory_error = attribute_of("torch", "OutOfMemoryError");
  ProgramType.tp_dictoffset = offsetof(ProgramObject, dict);
  ProgramType.tp_getattro = PyObject_GenericGetAttr;
  ProgramType.tp_setattro = PyObject_GenericSetAttr;
  ProgramType.tp_methods = program_methods;
  ProgramType.tp_members = program_members;
  ProgramType.tp_getset = program_getset;
  ProgramType.tp_repr = program_repr;
  if (ready_callable_type(&ProgramType, "kiln_host_runtime.Program", sizeof(ProgramObject),
                          program_new, program_dealloc, offsetof(ProgramObject, vectorcall),
                          "Program(init, call, n_inputs, n_outputs, externs, functions, name)") < 0)
    return nullptr;
  if (ready_callable_type(&MatchType, "kiln_host_runtime.TensorsMatch", sizeof(MatchObject),
                          match_new, match_dealloc, offsetof(MatchObject, vectorcall),
                          "TensorsMatch(specs): called with tensors, whether each matches") < 0)
    return nullptr;
  if (ready_callable_type(&OnType, "kiln_host_runtime.TensorsOn", sizeof(OnObject), on_new,
                          on_dealloc, offsetof(OnObject, vectorcall),
                          "TensorsOn(specs): called with a storage, new tensors over it") < 0)
    return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&ProgramType);
  PyModule_AddObject(m, "Program", reinterpret_cast<PyObject*>(&ProgramType));
  Py_INCREF(&MatchType);
  PyModule_AddObject(m, "TensorsMatch", reinterpret_cast<PyObject*>(&MatchType));
  Py_INCREF(&OnType);
  PyModule_AddObject(m, "TensorsOn", reinterpret_cast<PyObject*>(&OnType));
  PyModule_AddIntConstant(m, "API_VERSION", KILN_API_VERSION);
  return m;
}
