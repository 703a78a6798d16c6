"""Device serving path: the dsv41 serving attention on the kernel dispatchers (kernel_path) and
a device-clean layer loop (layer_loop). Pure torch + kernels; never imports sglang."""
