// torch 2.14 symbols that SGLang's prebuilt kernel libraries import and torch 2.11 lacks,
// defined as forwards to their torch 2.11 twins (test infrastructure for the lent H200, whose
// image has torch 2.11; a stock SGLang node has the torch these libraries were built against).
//
//   library                                  needs
//   sglang-kernel 0.4.10 sm90/common_ops     the first five
//   sgl-deep-gemm 0.2.3.post2 _C             2-5 and the last four
//
// 2.14 symbol                                        2.11 twin
// c10::cuda::CUDAErrorLogCapture()                   none: 2.14's class is empty, a no-op
// c10::cuda::c10_cuda_check_implementation(          the same function without the capture
//     int, char const*, char const*, unsigned, bool, CUDAErrorLogCapture*)
// c10::NotImplementedError(SourceLocation, string)   c10::Error's constructor (2.11 inherits
// c10::ValueError(SourceLocation, string)            it) and the class's own vtable
// torch::Library::_def(FunctionSchema&&, OperatorName*, vector<headeronly::Tag> const&,
//     _RegisterOrVerify) &                            the same with vector<at::Tag> (one enum)
// torch::Library::_def(variant<OperatorName, FunctionSchema>&&, CppFunction&&,
//     vector<headeronly::Tag> const&) &               the same with vector<at::Tag>
// at::TensorBase::const_data_ptr<float>() const      const_data_ptr<float, 0>() const
// torch_exception_get_what[_without_backtrace]()     none: 2.14's stable-ABI message store;
//                                                    read on error paths only, a fixed text
//
// Every declaration below names its symbol by its mangled name; no torch header is needed, so
// the build does not depend on the installed torch's headers, only on its libraries (linked
// with --no-undefined: a twin missing from that torch fails the build, not a server).
#include <cstdint>
#include <string>
#include <utility>

#define SYMBOL(name) __asm__(name)

namespace shim {

struct SourceLocation {  // c10::SourceLocation, passed by value (24 bytes, in memory)
  const char* function;
  const char* file;
  std::uint32_t line;
};

// ---------------------------------------------------------------- torch 2.11 twins
void cuda_check_211(std::int32_t err, const char* file, const char* func, std::uint32_t line,
                    bool device_assertions)
    SYMBOL("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb");
void error_ctor_211(void* self, SourceLocation loc, std::string msg)
    SYMBOL("_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
void* def_schema_211(void* self, void* schema, void* out_name, const void* tags, int register_or_verify)
    SYMBOL("_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorIN2at3TagESaIS8_EENS_17_RegisterOrVerifyE");
void* def_function_211(void* self, void* name_or_schema, void* function, const void* tags)
    SYMBOL("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorIN2at3TagESaISB_EE");
const float* const_data_ptr_float_211(const void* self)
    SYMBOL("_ZNK2at10TensorBase14const_data_ptrIfLi0EEEPKT_v");
extern char not_implemented_vtable[] SYMBOL("_ZTVN3c1019NotImplementedErrorE");
extern char value_error_vtable[] SYMBOL("_ZTVN3c1010ValueErrorE");

// ---------------------------------------------------------------- torch 2.14 symbols
void error_log_capture_ctor(void* self) SYMBOL("_ZN3c104cuda19CUDAErrorLogCaptureC1Ev");
void cuda_check_214(std::int32_t err, const char* file, const char* func, std::uint32_t line,
                    bool device_assertions, void* capture)
    SYMBOL("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE");
void not_implemented_ctor(void* self, SourceLocation loc, std::string msg)
    SYMBOL("_ZN3c1019NotImplementedErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
void value_error_ctor(void* self, SourceLocation loc, std::string msg)
    SYMBOL("_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
void* def_schema_214(void* self, void* schema, void* out_name, const void* tags, int register_or_verify)
    SYMBOL("_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorINS_10headeronly3TagESaIS8_EENS_17_RegisterOrVerifyE");
void* def_function_214(void* self, void* name_or_schema, void* function, const void* tags)
    SYMBOL("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorINS_10headeronly3TagESaISB_EE");
const float* const_data_ptr_float_214(const void* self)
    SYMBOL("_ZNK2at10TensorBase14const_data_ptrIfEEPKT_v");

void error_log_capture_ctor(void*) {}

void cuda_check_214(std::int32_t err, const char* file, const char* func, std::uint32_t line,
                    bool device_assertions, void*) {
  cuda_check_211(err, file, func, line, device_assertions);
}

// A derived error class of 2.11 adds no members to c10::Error: construct the Error base, then
// point the object at the derived class's vtable (what the inherited constructor does).
static void set_vtable(void* self, char* vtable) {
  *static_cast<void**>(self) = vtable + 2 * sizeof(void*);  // past offset-to-top and typeinfo
}

void not_implemented_ctor(void* self, SourceLocation loc, std::string msg) {
  error_ctor_211(self, loc, std::move(msg));
  set_vtable(self, not_implemented_vtable);
}

void value_error_ctor(void* self, SourceLocation loc, std::string msg) {
  error_ctor_211(self, loc, std::move(msg));
  set_vtable(self, value_error_vtable);
}

void* def_schema_214(void* self, void* schema, void* out_name, const void* tags,
                     int register_or_verify) {
  return def_schema_211(self, schema, out_name, tags, register_or_verify);
}

void* def_function_214(void* self, void* name_or_schema, void* function, const void* tags) {
  return def_function_211(self, name_or_schema, function, tags);
}

const float* const_data_ptr_float_214(const void* self) { return const_data_ptr_float_211(self); }

}  // namespace shim

extern "C" {
const char* torch_exception_get_what() {
  return "torch exception text unavailable (torch 2.11 shim: no stable-ABI message store)";
}
const char* torch_exception_get_what_without_backtrace() { return torch_exception_get_what(); }
}
