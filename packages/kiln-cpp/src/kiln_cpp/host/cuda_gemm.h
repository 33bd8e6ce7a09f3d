// Matrix products on CUDA through cuBLASLt, prepared once: part of runtime.cpp (included in
// its anonymous namespace, after the error helpers).
//
// A host program computes D[m, n] = A[m, k] @ B[k, n] (+ bias[n]) for row-major D with one
// cublasLtMatmul call: no dispatcher, no tensor, no per-call layout checks. In cuBLAS's
// column-major terms that is D^T = B^T @ A^T, so cuBLAS's first operand is B. The algorithm
// is the heuristic's first choice for the pointers' alignment (as ATen asks for it), looked
// up once per alignment. cuBLASLt is the library torch has loaded (no CUDA headers: the few
// types and constants it needs are declared here, as cublasLt.h defines them).

using LtHandle = void*;
using LtDesc = void*;
using LtLayout = void*;
using LtPreference = void*;
struct LtAlgo {
  uint64_t data[8];
};
struct LtHeuristic {
  LtAlgo algo;
  size_t workspace_size;
  int state;
  float waves;
  int reserved[4];
};

constexpr int LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7,
              LT_DESC_BIAS_POINTER = 8;
constexpr int LT_PREF_MAX_WORKSPACE = 1, LT_PREF_ALIGN_A = 5, LT_PREF_ALIGN_B = 6,
              LT_PREF_ALIGN_C = 7, LT_PREF_ALIGN_D = 8;
constexpr uint32_t LT_EPILOGUE_DEFAULT = 1, LT_EPILOGUE_BIAS = 4;
constexpr int COMPUTE_32F = 68;                        // cublasComputeType_t
constexpr int R_32F = 0, R_16F = 2, R_16BF = 14;      // cudaDataType
constexpr size_t LT_WORKSPACE_BYTES = 32 << 20;

struct CublasLt {
  int (*create)(LtHandle*);
  int (*desc_create)(LtDesc*, int, int);
  int (*desc_set)(LtDesc, int, const void*, size_t);
  int (*layout_create)(LtLayout*, int, uint64_t, uint64_t, int64_t);
  int (*preference_create)(LtPreference*);
  int (*preference_set)(LtPreference, int, const void*, size_t);
  int (*heuristic)(LtHandle, LtDesc, LtLayout, LtLayout, LtLayout, LtLayout, LtPreference, int,
                   LtHeuristic*, int*);
  int (*matmul)(LtHandle, LtDesc, const void*, const void*, LtLayout, const void*, LtLayout,
                const void*, const void*, LtLayout, void*, LtLayout, const LtAlgo*, void*, size_t,
                void*);
  LtHandle handle = nullptr;
};

// cuBLASLt as torch loaded it, or null (with the reason kept) where it is not loaded
const CublasLt* cublas_lt() {
  static const CublasLt* lt = []() -> const CublasLt* {
    void* lib = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
    }
    if (lib == nullptr) return nullptr;
    auto* t = new CublasLt;
    auto get = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    bool ok = get(t->create, "cublasLtCreate") && get(t->desc_create, "cublasLtMatmulDescCreate") &&
              get(t->desc_set, "cublasLtMatmulDescSetAttribute") &&
              get(t->layout_create, "cublasLtMatrixLayoutCreate") &&
              get(t->preference_create, "cublasLtMatmulPreferenceCreate") &&
              get(t->preference_set, "cublasLtMatmulPreferenceSetAttribute") &&
              get(t->heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
              get(t->matmul, "cublasLtMatmul");
    if (!ok || t->create(&t->handle) != 0) return nullptr;
    return t;
  }();
  return lt;
}

// one workspace per device, allocated when the first product on it is prepared
void* lt_workspace(int device) {
  static auto& workspaces = *new std::vector<at::Tensor>(64);  // kept until the process exits
  if (!workspaces.at(device).defined()) {
    const int64_t size = LT_WORKSPACE_BYTES, stride = 1;
    workspaces[device] =
        at::empty_strided({&size, 1}, {&stride, 1},
                          at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  }
  return workspaces[device].data_ptr();
}

struct Gemm {
  LtDesc desc = nullptr;
  LtLayout a = nullptr, b = nullptr, d = nullptr;  // cuBLAS's A (our B), B (our A), D
  bool bias = false;
  void* workspace = nullptr;
  LtAlgo algos[9];   // per alignment 1, 2, ..., 256 bytes
  bool found[9] = {};
  std::string name;
};

int alignment_class(uintptr_t pointers) {
  int c = 0;
  while (c < 8 && ((pointers >> c) & 1) == 0) ++c;
  return c;  // 2**c bytes
}

// the heuristic's algorithm for pointers aligned to 2**c bytes; false (error kept) if none
bool find_algo(Gemm* g, int c, const void* bias) {
  const CublasLt* lt = cublas_lt();
  LtPreference pref = nullptr;
  uint64_t workspace = LT_WORKSPACE_BYTES;
  uint32_t align = 1u << c;
  int status = lt->preference_create(&pref);
  if (status == 0) status = lt->preference_set(pref, LT_PREF_MAX_WORKSPACE, &workspace, 8);
  for (int attr : {LT_PREF_ALIGN_A, LT_PREF_ALIGN_B, LT_PREF_ALIGN_C, LT_PREF_ALIGN_D}) {
    if (status == 0) status = lt->preference_set(pref, attr, &align, 4);
  }
  if (status == 0 && g->bias) status = lt->desc_set(g->desc, LT_DESC_BIAS_POINTER, &bias, 8);
  LtHeuristic result{};
  int found = 0;
  if (status == 0)
    status = lt->heuristic(lt->handle, g->desc, g->a, g->b, g->d, g->d, pref, 1, &result, &found);
  if (status != 0 || found == 0) {
    last_kind = ErrorKind::Runtime;
    last_error = g->name + ": cuBLASLt has no algorithm for it (status " +
                 std::to_string(status) + ")";
    return false;
  }
  g->algos[c] = result.algo;
  g->found[c] = true;
  return true;
}

int api_cuda_gemm(KilnExtern* gemm, void* stream, const void* a, const void* b, const void* bias,
                  void* d) {
  auto* g = reinterpret_cast<Gemm*>(gemm);
  const CublasLt* lt = cublas_lt();
  uintptr_t all = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                  reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(bias);
  int c = alignment_class(all);
  if (!g->found[c] && !find_algo(g, c, bias)) return 1;
  if (g->bias && lt->desc_set(g->desc, LT_DESC_BIAS_POINTER, &bias, 8) != 0) {
    last_kind = ErrorKind::Runtime;
    last_error = g->name + ": setting the bias failed";
    return 1;
  }
  const float one = 1.0f, zero = 0.0f;
  // cuBLAS's A is our B and its B our A: D^T = B^T A^T
  int status = lt->matmul(lt->handle, g->desc, &one, b, g->a, a, g->b, &zero, d, g->d, d, g->d,
                          &g->algos[c], g->workspace, LT_WORKSPACE_BYTES, stream);
  if (status != 0) {
    last_kind = ErrorKind::Runtime;
    last_error = g->name + ": cublasLtMatmul failed (status " + std::to_string(status) + ")";
    return 1;
  }
  return 0;
}

void gemm_destructor(PyObject* capsule) {
  delete static_cast<Gemm*>(PyCapsule_GetPointer(capsule, "kiln.Gemm"));
}

// Gemm(dtype, m, n, k, a_ld, a_by_columns, b_ld, b_by_columns, d_ld, bias, device, name):
// D[m, n] = A[m, k] @ B[k, n] (+ bias[n]); an operand "by columns" is stored transposed
// (its stride along rows is 1, its leading dimension the stride along columns).
PyObject* make_gemm(PyObject*, PyObject* args) {
  PyObject* dtype;
  long long m, n, k, a_ld, b_ld, d_ld;
  int a_by_columns, b_by_columns, bias, device;
  const char* name;
  if (!PyArg_ParseTuple(args, "O!LLLLpLpLpis", &THPDtypeType, &dtype, &m, &n, &k, &a_ld,
                        &a_by_columns, &b_ld, &b_by_columns, &d_ld, &bias, &device, &name))
    return nullptr;
  const CublasLt* lt = cublas_lt();
  if (lt == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "cuBLASLt is not loaded in this process");
    return nullptr;
  }
  int type;
  switch (reinterpret_cast<THPDtype*>(dtype)->scalar_type) {
    case at::kFloat: type = R_32F; break;
    case at::kHalf: type = R_16F; break;
    case at::kBFloat16: type = R_16BF; break;
    default:
      PyErr_SetString(PyExc_TypeError, "Gemm takes float32, float16 or bfloat16");
      return nullptr;
  }
  auto g = std::make_unique<Gemm>();
  g->bias = bias != 0;
  g->name = name;
  // cuBLAS's A is our B: column-major n x k when B is stored by rows (op N), else k x n (op T)
  int trans_a = b_by_columns ? 1 : 0, trans_b = a_by_columns ? 1 : 0;
  uint32_t epilogue = g->bias ? LT_EPILOGUE_BIAS : LT_EPILOGUE_DEFAULT;
  int status = lt->desc_create(&g->desc, COMPUTE_32F, R_32F);
  if (status == 0) status = lt->desc_set(g->desc, LT_DESC_TRANSA, &trans_a, 4);
  if (status == 0) status = lt->desc_set(g->desc, LT_DESC_TRANSB, &trans_b, 4);
  if (status == 0) status = lt->desc_set(g->desc, LT_DESC_EPILOGUE, &epilogue, 4);
  if (status == 0)
    status = trans_a ? lt->layout_create(&g->a, type, k, n, b_ld)
                     : lt->layout_create(&g->a, type, n, k, b_ld);
  if (status == 0)
    status = trans_b ? lt->layout_create(&g->b, type, m, k, a_ld)
                     : lt->layout_create(&g->b, type, k, m, a_ld);
  if (status == 0) status = lt->layout_create(&g->d, type, n, m, d_ld);
  if (status != 0) {
    PyErr_Format(PyExc_RuntimeError, "%s: cuBLASLt descriptors failed (status %d)", name, status);
    return nullptr;
  }
  try {
    g->workspace = lt_workspace(device);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  // the algorithm for fully aligned pointers now: a product cuBLASLt cannot run is not rendered
  if (!find_algo(g.get(), 8, reinterpret_cast<void*>(uintptr_t{256}))) {
    PyErr_SetString(PyExc_RuntimeError, last_error.c_str());
    last_error.clear();
    return nullptr;
  }
  return PyCapsule_New(g.release(), "kiln.Gemm", gemm_destructor);
}
