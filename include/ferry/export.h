/* FERRY_EXPORT marks libferry's public API, from C and from C++. libferry is built with hidden
 * visibility: a symbol without this mark stays inside the library. */
#ifndef FERRY_EXPORT_H_
#define FERRY_EXPORT_H_

#if defined(__cplusplus)
#define FERRY_EXPORT [[gnu::visibility("default")]]
#elif defined(__GNUC__)
#define FERRY_EXPORT __attribute__((visibility("default")))
#else
#define FERRY_EXPORT
#endif

#endif /* FERRY_EXPORT_H_ */
