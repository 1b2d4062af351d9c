// The device function of cudart_rdc, in its own translation unit: calling it from another one
// needs relocatable device code (-rdc=true), so nvcc device-links the program and registers a
// version-2 fat-binary wrapper (the linked container plus each unit's prelinked one).
__device__ float add_values(float a, float b) {
  return a + b;
}
