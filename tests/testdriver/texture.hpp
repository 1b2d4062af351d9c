// Texture fetches for kernel bodies (arrays.cpp): what tex2D<float> returns for a texture object
// with clamp addressing, point filtering and unnormalized coordinates. Throws DeviceFault when
// the object is not a live texture of one float channel.
#pragma once

namespace mpsshim::testdriver {

float fetch_texel_f32(unsigned long long tex, long x, long y);

}  // namespace mpsshim::testdriver
