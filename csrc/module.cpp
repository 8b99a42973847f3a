// The Python module turbo_inductor._native. Importing it loads the library, which registers the ops of
// registration.cpp and the CUDA kernels.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {}
