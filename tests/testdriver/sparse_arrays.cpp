// Sparse CUDA arrays in the test driver: their sparse properties and cuMemMapArrayAsync, which
// maps their tiles onto tile-pool allocations (cuMemCreate with CU_MEM_CREATE_USAGE_TILE_POOL)
// and unmaps them, with the checks cuda.h gives the real driver. Measured on an H200 (driver
// 580, tools/probes/array_planes_sparse.cpp, tests/gpu/programs/rt_sparse_array.cu): a 1024 x
// 1024 float array has 128 x 128 tiles of 64 KiB and no mip tail (first level 0, size 0); the
// tile pool's granularity is 2 MiB; tiles mapped onto a pool are written and read back through
// copies and texture fetches; a pool made without the tile-pool usage, an offset that is not a
// tile's, a mip-tail mapping of a plain array and its memory requirements answer
// CUDA_ERROR_INVALID_VALUE.
//
// What the model leaves out: a tile's bytes live in the array's own storage, not in the
// allocation it maps (nothing here reads an allocation through two tiles), and that storage is
// the whole array's device memory, which the real driver does not take; copies reach every
// tile, mapped or not; a mapping takes effect when called, not in the stream's order. The tile
// shapes for other element sizes and for 3D arrays are the standard 64 KiB shapes, unmeasured.
// A mipmapped array's tail is one tile, one per layer of a layered array.
#include <algorithm>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr std::size_t kTileBytes = std::size_t{64} << 10;
// Tile numbers at and past this are a mip tail's: kMiptailTiles + its layer (a tail is one tile).
constexpr std::uint64_t kMiptailTiles = std::uint64_t{1} << 62;

bool is_sparse(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return (d.Flags & CUDA_ARRAY3D_SPARSE) != 0;
}
bool is_layered(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return (d.Flags & CUDA_ARRAY3D_LAYERED) != 0;
}
bool is_3d(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return d.Depth != 0 && !is_layered(d);
}

struct Extent3 {
  unsigned width, height, depth;
};

// The tile of an array with `element`-byte texels: 64 KiB in a 2D or 3D block.
Extent3 tile_of(const CUDA_ARRAY3D_DESCRIPTOR& d, std::size_t element) {
  if (is_3d(d)) {
    switch (element) {
      case 1:
        return {64, 32, 32};
      case 2:
        return {32, 32, 32};
      case 4:
        return {32, 32, 16};
      case 8:
        return {32, 16, 16};
      default:
        return {16, 16, 16};
    }
  }
  switch (element) {
    case 1:
      return {256, 256, 1};
    case 2:
      return {256, 128, 1};
    case 4:
      return {128, 128, 1};
    case 8:
      return {128, 64, 1};
    default:
      return {64, 64, 1};
  }
}

std::size_t layers_of(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return is_layered(d) ? std::max<std::size_t>(d.Depth, 1) : 1;
}

// A level smaller than one tile in any dimension is part of the mip tail.
bool in_tail(const Array& level) {
  const Extent3 tile = tile_of(level.desc, level.element);
  return level.desc.Width < tile.width || level.desc.Height < tile.height ||
         (is_3d(level.desc) && level.desc.Depth < tile.depth);
}

unsigned first_tail_level(const MipmappedArray& m, State& s) {
  unsigned level = 0;
  while (level < m.levels.size() && !in_tail(*s.arrays.get(m.levels[level]))) ++level;
  return level;
}

CUDA_ARRAY_SPARSE_PROPERTIES properties_of(const Array& level0, unsigned tail_level,
                                           std::size_t tail_bytes) {
  CUDA_ARRAY_SPARSE_PROPERTIES out{};
  const Extent3 tile = tile_of(level0.desc, level0.element);
  out.tileExtent.width = tile.width;
  out.tileExtent.height = tile.height;
  out.tileExtent.depth = tile.depth;
  out.miptailFirstLevel = tail_level;
  out.miptailSize = tail_bytes;
  return out;
}

std::size_t round_up(std::size_t v, std::size_t to) {
  return (v + to - 1) / to * to;
}

// One checked map or unmap: the tiles of `array` it covers, and what they map.
struct TileUpdate {
  Array* array;
  std::vector<std::uint64_t> tiles;
  CUmemGenericAllocationHandle allocation;  // 0: unmap
  std::size_t offset;
};

// The tiles a sparse-level entry covers, numbered (layer, z, y, x) over the level.
CUresult level_tiles(const Array& level, const CUarrayMapInfo& info,
                     std::vector<std::uint64_t>& out) {
  const auto& r = info.subresource.sparseLevel;
  const Extent3 tile = tile_of(level.desc, level.element);
  const bool three_d = is_3d(level.desc);
  if (r.layer >= layers_of(level.desc)) return CUDA_ERROR_INVALID_VALUE;
  if (!three_d && (r.offsetZ != 0 || r.extentDepth != 1)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t width = round_up(level.desc.Width, tile.width);
  const std::size_t height = round_up(level.desc.Height, tile.height);
  const std::size_t depth = three_d ? round_up(level.desc.Depth, tile.depth) : 1;
  const auto fits = [](unsigned offset, unsigned extent, std::size_t tile_dim, std::size_t dim) {
    return extent != 0 && offset % tile_dim == 0 && extent % tile_dim == 0 &&
           std::size_t{offset} + extent <= dim;
  };
  if (!fits(r.offsetX, r.extentWidth, tile.width, width) ||
      !fits(r.offsetY, r.extentHeight, tile.height, height) ||
      !fits(r.offsetZ, r.extentDepth, three_d ? tile.depth : 1, depth)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t across = width / tile.width, down = height / tile.height;
  const std::size_t deep = depth / (three_d ? tile.depth : 1);
  for (unsigned z = r.offsetZ / (three_d ? tile.depth : 1);
       z < (r.offsetZ + r.extentDepth) / (three_d ? tile.depth : 1); ++z) {
    for (unsigned y = r.offsetY / tile.height; y < (r.offsetY + r.extentHeight) / tile.height;
         ++y) {
      for (unsigned x = r.offsetX / tile.width; x < (r.offsetX + r.extentWidth) / tile.width; ++x) {
        out.push_back(((r.layer * deep + z) * down + y) * across + x);
      }
    }
  }
  return CUDA_SUCCESS;
}

CUresult check_entry(State& s, const CUarrayMapInfo& info, const Stream& stream, TileUpdate& out) {
  if (info.flags != 0 || info.reserved[0] != 0 || info.reserved[1] != 0 ||
      info.deviceBitMask != (1u << stream.device)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Array* level = nullptr;
  MipmappedArray* mipmap = nullptr;
  switch (info.resourceType) {
    case CU_RESOURCE_TYPE_ARRAY:
      level = s.arrays.get(info.resource.array);
      if (level == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      if (level->level_of != nullptr || !is_sparse(level->desc)) return CUDA_ERROR_INVALID_VALUE;
      if (level->device != stream.device) return CUDA_ERROR_INVALID_VALUE;
      break;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      mipmap = s.mipmaps.get(info.resource.mipmap);
      if (mipmap == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      if (!is_sparse(mipmap->desc) || mipmap->device != stream.device) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  out.tiles.clear();
  if (info.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL) {
    const unsigned index = info.subresource.sparseLevel.level;
    if (mipmap != nullptr) {
      if (index >= first_tail_level(*mipmap, s)) return CUDA_ERROR_INVALID_VALUE;
      level = s.arrays.get(mipmap->levels[index]);
    } else if (index != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult r = level_tiles(*level, info, out.tiles); r != CUDA_SUCCESS) return r;
  } else if (info.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    // A plain array has no tail (H200: CUDA_ERROR_INVALID_VALUE), nor one whose every level
    // spans a tile.
    if (mipmap == nullptr || first_tail_level(*mipmap, s) == mipmap->levels.size()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const auto& tail = info.subresource.miptail;
    if (tail.layer >= layers_of(mipmap->desc) || tail.size == 0 || tail.offset % kTileBytes != 0 ||
        tail.size % kTileBytes != 0 || tail.offset + tail.size > kTileBytes) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    level = s.arrays.get(mipmap->levels.front());
    // One tail per layer of a layered array (no SINGLE_MIPTAIL flag), one in all for others.
    out.tiles.push_back(kMiptailTiles + tail.layer);
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  out.array = level;
  out.offset = info.offset;
  out.allocation = 0;
  if (info.memOperationType == CU_MEM_OPERATION_TYPE_UNMAP) {
    return info.memHandle.memHandle == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  if (info.memOperationType != CU_MEM_OPERATION_TYPE_MAP ||
      info.memHandleType != CU_MEM_HANDLE_TYPE_GENERIC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto pool = s.vmm.physical.find(info.memHandle.memHandle);
  if (pool == s.vmm.physical.end() || pool->second.refs == 0) return CUDA_ERROR_INVALID_HANDLE;
  const PhysicalAllocation& memory = pool->second;
  if ((memory.prop.allocFlags.usage & CU_MEM_CREATE_USAGE_TILE_POOL) == 0 ||
      memory.device != stream.device || info.offset % kTileBytes != 0 ||
      info.offset > memory.size || out.tiles.size() > (memory.size - info.offset) / kTileBytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  out.allocation = info.memHandle.memHandle;
  return CUDA_SUCCESS;
}

// The tile's mapping goes; its allocation too when nothing else holds it.
void unmap_tile(State& s, const SparseTile& tile) {
  auto it = s.vmm.physical.find(tile.allocation);
  if (it == s.vmm.physical.end()) return;
  if (--it->second.mappings == 0 && it->second.refs == 0) destroy_physical(s, tile.allocation);
}

void apply(State& s, const TileUpdate& update) {
  std::size_t offset = update.offset;
  for (std::uint64_t number : update.tiles) {
    if (auto old = update.array->tiles.find(number); old != update.array->tiles.end()) {
      const SparseTile was = old->second;
      update.array->tiles.erase(old);
      unmap_tile(s, was);
    }
    if (update.allocation != 0) {
      update.array->tiles[number] = SparseTile{update.allocation, offset};
      ++s.vmm.physical.at(update.allocation).mappings;
      offset += kTileBytes;
    }
  }
}

}  // namespace

void unmap_tiles(State& s, Array& array) {
  for (const auto& [number, tile] : array.tiles) unmap_tile(s, tile);
  array.tiles.clear();
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUarray handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Array* a = s.arrays.get(handle);
    if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr || !is_sparse(a->desc)) return CUDA_ERROR_INVALID_VALUE;
    // As an H200 answers for a 1024 x 1024 float array: mip tail level 0 of size 0 (an array
    // smaller than a tile is unmeasured and answered the same).
    *out = properties_of(*a, 0, 0);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuMipmappedArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUmipmappedArray handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    MipmappedArray* m = s.mipmaps.get(handle);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr || !is_sparse(m->desc)) return CUDA_ERROR_INVALID_VALUE;
    const unsigned tail = first_tail_level(*m, s);
    *out = properties_of(*s.arrays.get(m->levels.front()), tail,
                         tail < m->levels.size() ? kTileBytes : 0);
    if (!is_layered(m->desc)) out->flags = CU_ARRAY_SPARSE_PROPERTIES_SINGLE_MIPTAIL;
    return CUDA_SUCCESS;
  });
}

// Every entry is checked before any applies (the real driver's order is unmeasured).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemMapArrayAsync(CUarrayMapInfo* infos,
                                                              unsigned int count, CUstream handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, handle, stream); r != CUDA_SUCCESS) return r;
    if (infos == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
    std::vector<TileUpdate> updates(count);
    for (unsigned i = 0; i < count; ++i) {
      if (CUresult r = check_entry(s, infos[i], *stream, updates[i]); r != CUDA_SUCCESS) return r;
    }
    for (const TileUpdate& update : updates) apply(s, update);
    return CUDA_SUCCESS;
  });
}
