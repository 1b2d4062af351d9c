// User objects (cuUserObjectCreate and friends): a pointer and a destructor the driver runs once
// nothing holds a reference any more. They never reach the server: the references are the
// client's, held by the program, by its graphs and by the executable graphs made from them, so
// the shim counts them itself (user_objects.cpp; docs/graphs.md, "User objects").
#pragma once

#include <cuda.h>

#include <utility>
#include <vector>

namespace mpsshim::shim {

struct UserObject;

// References a graph or an executable graph holds: each object once, with its count.
using UserObjectRefs = std::vector<std::pair<UserObject*, unsigned>>;

// One more set of `refs`' references (a graph's, copied into a clone or an executable graph).
void retain_user_refs(const UserObjectRefs& refs);
// Lets go of every reference in `refs` and empties it; an object's last one runs its destructor
// on a thread of its own, as the driver's internal thread would.
void release_user_refs(UserObjectRefs& refs);
// Adds `more` to `into`.
void merge_user_refs(UserObjectRefs& into, const UserObjectRefs& more);

}  // namespace mpsshim::shim
