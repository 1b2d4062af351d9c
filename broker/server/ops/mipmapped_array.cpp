// Mipmapped arrays: made by the server's driver, charged to the client as the sum of their
// levels, their levels handed out as CUDA arrays of the client's (ArrayObj::mipmap) that copies
// and surfaces take like any array, destroyed with their levels (docs/copies.md).
#include <algorithm>
#include <limits>

#include "broker/server/ops/array_format.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"
#include "proto/ops_copies.hpp"

namespace mpsshim::server {
namespace {

__extension__ using u128 = unsigned __int128;

// What the levels hold: each halves width, height and (unless layered) depth, down to 1.
u128 levels_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, std::uint64_t element) {
  u128 total = 0;
  const bool layered = (d.Flags & CUDA_ARRAY3D_LAYERED) != 0;
  for (unsigned l = 0; l < levels && l < 64; ++l) {
    const u128 w = std::max<std::uint64_t>(d.Width >> l, 1);
    const u128 h = d.Height == 0 ? 1 : std::max<std::uint64_t>(d.Height >> l, 1);
    const u128 z =
        d.Depth == 0 ? 1 : (layered ? d.Depth : std::max<std::uint64_t>(d.Depth >> l, 1));
    total += w * h * z * element;
  }
  return total;
}

}  // namespace

OpResult op_mipmapped_array_create(Call& call) {
  auto req = call.request<proto::ArrayCreateReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  const proto::ArrayDescriptor& d = req.desc;
  const unsigned levels = d.reserved;
  if (CUresult r = check_array_format(session, d, "a mipmapped array"); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (d.width == 0 || levels == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t element = proto::element_bytes(d.format, d.channels);
  const CUDA_ARRAY3D_DESCRIPTOR desc = driver_descriptor(d);
  const u128 bytes = levels_bytes(desc, levels, element);
  if (bytes > std::numeric_limits<std::uint64_t>::max()) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t charged = charged_at_creation(d, static_cast<std::uint64_t>(bytes));
  auto held = session.charge.reserve(charged);
  if (!held) return refuse_over_limit(call, charged, "a mipmapped array", held.error());
  CUmipmappedArray mipmap = nullptr;
  // The driver decides whether `levels` fits the extent (CUDA_ERROR_INVALID_VALUE).
  if (CUresult r = call.cu.cuMipmappedArrayCreate(&mipmap, &desc, levels); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  MipmappedArrayObj object{mipmap, req.ctx, desc, levels, element, charged, {}};
  object.levels_given.assign(levels, 0);
  const std::uint64_t id = session.objects.insert(std::move(object));
  if (id == 0) {
    call.cu.cuMipmappedArrayDestroy(mipmap);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  held->keep();
  return call.reply(proto::ArrayCreateRep{id, charged});
}

OpResult op_mipmapped_array_level(Call& call) {
  auto req = call.request<proto::ArrayLevelReq>();
  Session& session = call.session;
  MipmappedArrayObj* mipmap = session.objects.get<MipmappedArrayObj>(req.mipmap);
  if (mipmap == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (req.level >= mipmap->levels) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::uint64_t& given = mipmap->levels_given[req.level];
  // The level's array is handed out again while the client keeps it (it may have destroyed the
  // handle: cuArrayDestroy of a level).
  if (const ArrayObj* level = session.objects.get<ArrayObj>(given);
      given != 0 && level != nullptr && level->mipmap == req.mipmap) {
    return call.reply(proto::ArrayLevelRep{given, wire_descriptor(level->desc)});
  }
  CUarray array = nullptr;
  if (CUresult r = call.cu.cuMipmappedArrayGetLevel(&array, mipmap->mipmap, req.level);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  if (CUresult r = call.cu.cuArray3DGetDescriptor_v2(&desc, array); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  ArrayObj level{array, mipmap->ctx, desc, mipmap->element_bytes, 0};
  level.mipmap = req.mipmap;
  given = session.objects.insert(level);
  if (given == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::ArrayLevelRep{given, wire_descriptor(desc)});
}

OpResult op_mipmapped_array_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  auto mipmap = session.objects.take<MipmappedArrayObj>(req.handle);
  if (!mipmap) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // Its levels' handles go with it.
  for (std::uint64_t id : session.objects.ids_where<ArrayObj>(
           [&](const ArrayObj& a) { return a.mipmap == req.handle; })) {
    session.objects.take<ArrayObj>(id);
  }
  session.charge.release(mipmap->charged);
  drop_tile_pools(session, mipmap->tile_pools);
  Retired bundle;
  bundle.mipmaps.push_back(mipmap->mipmap);
  return call.done(retire(session, std::move(bundle)));
}

}  // namespace mpsshim::server
