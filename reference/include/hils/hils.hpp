// The whole reference: include this one header.
#pragma once

#include "hils/attention.hpp"
#include "hils/backward.hpp"
#include "hils/geometry.hpp"
#include "hils/positional.hpp"
#include "hils/spec.hpp"
#include "hils/types.hpp"
