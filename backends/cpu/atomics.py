"""What numba lacks for a crew of workers (crew.py) and the pieces it runs, as LLVM IR: atomic operations on an
int64 array's slots (sequentially consistent: the crew's protocol is written for that order), the pause
instruction, the time-stamp counter, a call through a cfunc's address, a syscall through an address held in an
array slot, and a typed pointer from an address (numba.carray makes arrays of them)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I64 = ir.IntType(64)


def _slot(context, builder, array_type, array, index):
    a = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, a, [index])


@intrinsic
def add(typingctx, array, index, value):
    """a[index] += value, atomically; the value before."""
    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _slot(context, builder, signature.args[0], args[0], args[1]), args[2],
                                  "seq_cst")
    return types.int64(array, index, value), codegen


@intrinsic
def cas(typingctx, array, index, old, new):
    """a[index] = new if it holds old, atomically; the value before."""
    def codegen(context, builder, signature, args):
        pair = builder.cmpxchg(_slot(context, builder, signature.args[0], args[0], args[1]), args[2], args[3],
                               "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)
    return types.int64(array, index, old, new), codegen


@intrinsic
def load(typingctx, array, index):
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_slot(context, builder, signature.args[0], args[0], args[1]), "seq_cst", 8)
    return types.int64(array, index), codegen


@intrinsic
def store(typingctx, array, index, value):
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _slot(context, builder, signature.args[0], args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


def _declared(builder, name, result, *params):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, list(params)), name)


@intrinsic
def pause(typingctx):
    """The spin-wait hint: the core slows the loop and lets its sibling thread run."""
    def codegen(context, builder, signature, args):
        builder.call(_declared(builder, "llvm.x86.sse2.pause", ir.VoidType()), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def cycles(typingctx):
    """The time-stamp counter."""
    def codegen(context, builder, signature, args):
        return builder.call(_declared(builder, "llvm.readcyclecounter", I64), [])
    return types.int64(), codegen


@intrinsic
def call(typingctx, fn, args, piece):
    """fn(args, piece) for the address of a cfunc void(int64, int64)."""
    def codegen(context, builder, signature, a):
        target = builder.inttoptr(a[0], ir.FunctionType(ir.VoidType(), [I64, I64]).as_pointer())
        builder.call(target, [a[1], a[2]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def syscall(typingctx, array, at, number, index, op, value):
    """libc's syscall (its address in array[at]) of number, with the address of array[index], op and value."""
    def codegen(context, builder, signature, a):
        array_type = signature.args[0]
        target = builder.inttoptr(builder.load(_slot(context, builder, array_type, a[0], a[1])),
                                  ir.FunctionType(I64, [I64] * 5).as_pointer())
        slot = builder.ptrtoint(_slot(context, builder, array_type, a[0], a[3]), I64)
        return builder.call(target, [a[2], slot, a[4], a[5], context.get_constant(types.int64, 0)])
    return types.int64(array, at, number, index, op, value), codegen


@intrinsic
def at(typingctx, address, dtype):
    """The address as a typed pointer to values of dtype, a numpy scalar type (np.float32, np.uint64, ...)."""
    kind = dtype.instance_type

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(kind).as_pointer())
    return types.CPointer(kind)(types.int64, dtype), codegen
